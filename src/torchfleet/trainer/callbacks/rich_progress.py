"""RichProgressBar: the progress bars drawn with ``rich`` (optional: ``pip install torchfleet[rich]``)."""

from __future__ import annotations

from typing import Any

from torchfleet.trainer.callbacks.model_summary import _require_rich
from torchfleet.trainer.callbacks.progress import ProgressBar, check_refresh_rate


class RichProgressBar(ProgressBar):
    """A rich task per training epoch and per evaluation run, redrawn every ``refresh_rate`` batches (0: no bar),
    with the step and the values logged with ``prog_bar=True``; on global rank 0 only.

    ``console_kwargs`` go to ``rich.console.Console`` (e.g. ``{"file": ...}``, ``{"force_terminal": True}``).
    """

    def __init__(self, refresh_rate: int = 1, leave: bool = False, console_kwargs: dict[str, Any] | None = None) -> None:
        _require_rich("RichProgressBar")
        check_refresh_rate(self, refresh_rate)
        if console_kwargs is not None and not isinstance(console_kwargs, dict):
            from torchfleet.errors import not_valid

            raise not_valid("console_kwargs", console_kwargs, "give a dict of rich.console.Console arguments or None",
                            "RichProgressBar")
        super().__init__(refresh_interval=0.0, leave=leave)
        self.refresh_rate = refresh_rate
        self.console_kwargs = dict(console_kwargs or {})
        self._progress: Any = None
        self._train_task: Any = None
        self._eval_task: Any = None
        if refresh_rate == 0:
            self.disable()

    @property
    def progress(self) -> Any:
        """The ``rich.progress.Progress`` drawing the bars (None outside a stage)."""
        return self._progress

    def _start(self) -> Any:
        if self._progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("{task.fields[metrics]}"),
                console=Console(**self.console_kwargs), auto_refresh=False,
            )
            self._progress.start()
        return self._progress

    @staticmethod
    def _total(total: Any) -> float | None:
        return None if total is None or total == float("inf") else float(total)

    def _metrics_text(self, trainer: Any) -> str:
        values = {"step": trainer.global_step, **self.get_metrics(trainer, trainer.lightning_module), **self._speed}
        return " ".join(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in values.items())

    # --------------------------------------------------------------- training
    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        if not self._active(trainer):
            return
        progress = self._start()
        if self._train_task is not None and not self.leave:
            progress.remove_task(self._train_task)
        self._train_task = progress.add_task(f"Epoch {trainer.current_epoch}", metrics="",
                                             total=self._total(trainer.num_training_batches))
        self._n = 0
        self._start_speed(trainer)

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._train_task is None:
            return
        self._n += 1
        if self._n % self.refresh_rate == 0:
            self._measure_speed(batch)  # samples/s (tokens/s, MFU) at redraws only, as ProgressBar's
            self._redraw(trainer)

    def _redraw(self, trainer: Any) -> None:
        self._progress.update(self._train_task, completed=self._n, metrics=self._metrics_text(trainer))
        self._progress.refresh()

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if self._train_task is not None:
            self._redraw(trainer)

    def on_train_end(self, trainer: Any, module: Any) -> None:
        self._stop()

    # ------------------------------------------------------------- evaluation
    def _eval_start(self, trainer: Any, desc: str, totals: list[Any]) -> None:
        if not self._active(trainer) or trainer.sanity_checking:
            return
        total = sum(t for t in totals if t != float("inf")) if totals else None
        self._eval_task = self._start().add_task(desc, metrics="", total=self._total(total))
        self._eval_n = 0

    def _eval_batch(self) -> None:
        if self._eval_task is not None:
            self._eval_n += 1
            if self._eval_n % self.refresh_rate == 0:
                self._progress.update(self._eval_task, completed=self._eval_n)
                self._progress.refresh()

    def _eval_end(self, trainer: Any) -> None:
        if self._eval_task is None:
            return
        self._progress.update(self._eval_task, completed=self._eval_n)
        if self._train_task is not None and trainer.state.fn == "fit":
            self._progress.remove_task(self._eval_task)  # the epoch's bar stays; validation's goes
            self._redraw(trainer)
        self._eval_task = None
        if trainer.state.fn != "fit":
            self._stop()

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        self._stop()

    def teardown(self, trainer: Any, module: Any, stage: str) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.refresh()
            self._progress.stop()
        self._progress = None
        self._train_task = self._eval_task = None
