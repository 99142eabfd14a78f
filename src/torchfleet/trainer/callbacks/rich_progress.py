"""RichProgressBar: the progress bars drawn with ``rich`` (optional: ``pip install torchfleet[rich]``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchfleet.trainer.callbacks.model_summary import _require_rich
from torchfleet.trainer.callbacks.progress import ProgressBar, check_refresh_rate


@dataclass
class RichProgressBarTheme:
    """The rich styles (``"bold red"``, ``"#6206E0"``, a ``rich.style.Style``) of a RichProgressBar's parts, and how
    it writes the logged values (joined by ``metrics_text_delimiter``, numbers in ``metrics_format``); Lightning's
    fields and defaults."""

    description: Any = ""
    progress_bar: Any = "#6206E0"
    progress_bar_finished: Any = "#6206E0"
    progress_bar_pulse: Any = "#6206E0"
    batch_progress: Any = ""
    time: Any = "dim"
    processing_speed: Any = "dim underline"  # kept for Lightning's programs: the speed is written with the metrics
    metrics: Any = "italic"  # the logged values, with the step and the speed
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"


class RichProgressBar(ProgressBar):
    """A rich task per training epoch and per evaluation run, redrawn every ``refresh_rate`` batches (0: no bar),
    with the step and the values logged with ``prog_bar=True``; on global rank 0 only.

    ``theme`` styles it (a ``RichProgressBarTheme``); ``console_kwargs`` go to ``rich.console.Console`` (e.g.
    ``{"file": ...}``, ``{"force_terminal": True}``).
    """

    def __init__(self, refresh_rate: int = 1, leave: bool = False, theme: RichProgressBarTheme | None = None,
                 console_kwargs: dict[str, Any] | None = None) -> None:
        _require_rich("RichProgressBar")
        check_refresh_rate(self, refresh_rate)
        if console_kwargs is not None and not isinstance(console_kwargs, dict):
            from torchfleet.errors import not_valid

            raise not_valid("console_kwargs", console_kwargs, "give a dict of rich.console.Console arguments or None",
                            "RichProgressBar")
        if theme is not None and not isinstance(theme, RichProgressBarTheme):
            from torchfleet.errors import not_valid

            raise not_valid("theme", theme, "give a RichProgressBarTheme(...) or None", "RichProgressBar")
        super().__init__(refresh_interval=0.0, leave=leave)
        self.refresh_rate = refresh_rate
        self.theme = theme if theme is not None else RichProgressBarTheme()
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
            from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn
            from rich.text import Text

            theme = self.theme

            class Counts(ProgressColumn):  # "done/total" ("?" without a length) in the theme's style
                def render(self, task: Any) -> Text:
                    total = "?" if task.total is None else int(task.total)
                    return Text(f"{int(task.completed)}/{total}", style=theme.batch_progress)

            class Elapsed(ProgressColumn):
                def render(self, task: Any) -> Text:
                    seconds = int(task.finished_time if task.finished else task.elapsed or 0)
                    return Text(f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}", style=theme.time)

            self._progress = Progress(
                TextColumn("[progress.description]{task.description}", style=theme.description),
                BarColumn(complete_style=theme.progress_bar, finished_style=theme.progress_bar_finished,
                          pulse_style=theme.progress_bar_pulse),
                Counts(), Elapsed(), TextColumn("{task.fields[metrics]}", style=theme.metrics),
                console=Console(**self.console_kwargs), auto_refresh=False,
            )
            self._progress.start()
        return self._progress

    @staticmethod
    def _total(total: Any) -> float | None:
        return None if total is None or total == float("inf") else float(total)

    def _metrics_text(self, trainer: Any) -> str:
        form = self.theme.metrics_format
        logged = {k: format(v, form) if isinstance(v, float) else v
                  for k, v in self.get_metrics(trainer, trainer.lightning_module).items()}
        speed = {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in self._speed.items()}
        values = {"step": trainer.global_step, **logged, **speed}
        return self.theme.metrics_text_delimiter.join(f"{k}: {v}" for k, v in values.items())

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
