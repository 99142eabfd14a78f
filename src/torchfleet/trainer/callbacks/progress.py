"""ProgressBar: tqdm bars for training, validation, test and predict, on rank 0 only."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from torchfleet.trainer.callbacks.base import Callback

#: the redraw clock, bound once: a program (or test) that replaces time.monotonic to drive validation does not
#: see the bar's reads of it
_clock = time.monotonic


def convert_inf(x: float | None) -> float | None:
    """None for an infinite or NaN count (a bar without a known total), the count otherwise."""
    return None if x is None or math.isinf(x) or math.isnan(x) else x


def get_standard_metrics(trainer: Any) -> dict[str, Any]:
    """What every progress bar shows besides the logged values: ``v_num``, the first logger's version, when it has one."""
    metrics: dict[str, Any] = {}
    version = getattr(trainer.loggers[0], "version", None) if trainer.loggers else None
    if version is not None:
        # as Lightning: a long string version (a wandb run id) is shortened to its last 4 characters
        metrics["v_num"] = version[-4:] if isinstance(version, str) else version
    return metrics


class ProgressBar(Callback):
    """A tqdm bar per epoch showing step, loss and everything logged with ``prog_bar=True``.

    Per batch it only counts; the bar is redrawn (and the metrics formatted) at most every
    ``refresh_interval`` seconds, so it costs about a microsecond per step. At each redraw it also shows
    ``samples/s`` (batches since the last redraw over the time since then, times the current batch's size) and,
    when a ``ThroughputMonitor`` runs, its ``tokens/s`` and ``mfu`` when it knows them.
    """

    def __init__(self, refresh_interval: float | None = None, leave: bool = True) -> None:
        from torchfleet.errors import check_flag, check_number

        check_number("refresh_interval", refresh_interval, 0, type(self).__name__, allow_none=True,
                     meaning="seconds between redraws; None: 0.1 on a terminal, 10 in a log file")
        check_flag("leave", leave, type(self).__name__)
        interactive = sys.stderr.isatty()
        # in a log file, a line every 10 s is plenty; on a terminal, 10 redraws a second
        self.refresh_interval = refresh_interval if refresh_interval is not None else (0.1 if interactive else 10.0)
        self.leave = leave
        self._enabled = True
        self._bar: Any = None
        self._eval_bar: Any = None
        self._n = 0
        self._next_refresh = 0.0
        self._speed: dict[str, str] = {}
        self._rate_from = (0, 0.0)
        self._monitor: Any = None

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        self._trainer = trainer

    @property
    def trainer(self) -> Any:
        """The Trainer this bar reports on (set when a stage starts)."""
        trainer = getattr(self, "_trainer", None)
        if trainer is None:
            from torchfleet.errors import ConfigurationError

            raise ConfigurationError(f"{type(self).__name__}.trainer is read before the bar was given to a running "
                                     "Trainer (Trainer(callbacks=[bar]) and fit/validate/test/predict set it).")
        return trainer

    @property
    def total_train_batches(self) -> int | float:
        """Training batches in this epoch (fewer when ``max_steps`` ends the run sooner; inf when unknown)."""
        t = self.trainer
        if t.max_epochs == -1 and t.max_steps is not None and t.max_steps > 0:
            return min(t.num_training_batches, t.max_steps - t.global_step)
        return t.num_training_batches

    @property
    def total_val_batches(self) -> int | float:
        """Validation batches of every validation loader in this epoch; 0 in an epoch that does not validate."""
        t = self.trainer
        every = t.check_val_every_n_epoch
        if every is not None and (t.current_epoch + 1) % every != 0:
            return 0
        return sum(t.num_val_batches)

    def _new_bar(self, desc: str, total: Any, leave: bool, position: int = 0) -> Any:
        from tqdm.auto import tqdm

        total = convert_inf(total)
        total = None if total is None else int(total)
        return tqdm(desc=desc, total=total, leave=leave, position=position, dynamic_ncols=True, file=sys.stderr,
                    mininterval=self.refresh_interval, smoothing=0.1)

    def _active(self, trainer: Any) -> bool:
        return self._enabled and trainer.is_global_zero

    # --------------------------------------------------------------- training
    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        if not self._active(trainer):
            return
        self._close(self._bar)
        total = trainer.num_training_batches
        self._bar = self._new_bar(f"Epoch {trainer.current_epoch}", total, self.leave)
        self._n = 0
        self._next_refresh = _clock() + self.refresh_interval
        self._start_speed(trainer)

    def _start_speed(self, trainer: Any) -> None:
        """Start counting samples/s for this epoch's postfix, and find the run's ThroughputMonitor (tokens/s, MFU)."""
        from torchfleet.trainer.callbacks.throughput import ThroughputMonitor

        self._speed = {}
        self._rate_from = (0, _clock())
        self._monitor = next((cb for cb in trainer.callbacks if isinstance(cb, ThroughputMonitor)), None)

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._bar is None:
            return
        self._n += 1
        now = _clock()
        if now >= self._next_refresh:
            self._next_refresh = now + self.refresh_interval
            self._measure_speed(batch, now)
            self._redraw(trainer)

    def _measure_speed(self, batch: Any, now: float | None = None) -> None:
        """Samples/s since the previous redraw (and the ThroughputMonitor's tokens/s and MFU), for the postfix;
        called at redraws only."""
        now = _clock() if now is None else now
        n0, t0 = self._rate_from
        if now <= t0 or self._n <= n0:
            return
        from torchfleet.trainer.logging import infer_batch_size

        self._rate_from = (self._n, now)
        monitor = self._monitor
        size = (monitor.batch_size_fn if monitor is not None else infer_batch_size)(batch)
        # a batch with no tensor in it has no size to count: tqdm's own it/s is the rate then
        speed = {"samples/s": f"{(self._n - n0) / (now - t0) * size:.4g}"} if size else {}
        measured = monitor.metrics if monitor is not None else {}
        if "throughput/tokens_per_sec" in measured:
            speed["tokens/s"] = f"{measured['throughput/tokens_per_sec']:.4g}"
        if "throughput/mfu" in measured:
            speed["mfu"] = f"{measured['throughput/mfu']:.1%}"
        self._speed = speed

    def get_metrics(self, trainer: Any, module: Any) -> dict[str, Any]:
        """What the bar shows after its counts: ``v_num`` (the first logger's version, when it has one) and every
        value logged with ``prog_bar=True``. Override it to change that, as in Lightning."""
        metrics = get_standard_metrics(trainer)
        metrics.update(trainer.progress_bar_metrics)
        return metrics

    def _redraw(self, trainer: Any) -> None:
        bar = self._bar
        bar.n = self._n
        shown = self.get_metrics(trainer, trainer.lightning_module)
        postfix = {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in shown.items()}
        postfix["step"] = trainer.global_step
        postfix.update(self._speed)
        bar.set_postfix(postfix, refresh=False)
        bar.refresh()

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if self._bar is not None:
            self._redraw(trainer)
            self._close(self._bar)
            self._bar = None

    def on_train_end(self, trainer: Any, module: Any) -> None:
        self._close(self._bar)
        self._bar = None

    # ------------------------------------------------------------- evaluation
    def _eval_start(self, trainer: Any, desc: str, totals: list[Any]) -> None:
        if not self._active(trainer) or trainer.sanity_checking:
            return
        total = sum(t for t in totals if t != float("inf")) if totals else None
        # "is not None": a tqdm bar without a total (data without a length) refuses bool()
        self._eval_bar = self._new_bar(desc, total, leave=self._bar is None, position=1 if self._bar is not None else 0)

    def _eval_batch(self) -> None:
        if self._eval_bar is not None:
            self._eval_bar.update(1)

    def _eval_end(self, trainer: Any) -> None:
        if self._eval_bar is not None:
            self._close(self._eval_bar)
            self._eval_bar = None
            if self._bar is not None and trainer.state.fn == "fit":
                self._redraw(trainer)

    def on_validation_start(self, trainer: Any, module: Any) -> None:
        self._eval_start(trainer, "Validation", trainer.num_val_batches)

    def on_validation_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch()

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        self._eval_end(trainer)

    def on_test_start(self, trainer: Any, module: Any) -> None:
        self._eval_start(trainer, "Test", trainer.num_test_batches)

    def on_test_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch()

    def on_test_end(self, trainer: Any, module: Any) -> None:
        self._eval_end(trainer)

    def on_predict_start(self, trainer: Any, module: Any) -> None:
        self._eval_start(trainer, "Predict", trainer.num_predict_batches)

    def on_predict_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch()

    def on_predict_end(self, trainer: Any, module: Any) -> None:
        self._eval_end(trainer)

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        self._close(self._eval_bar)
        self._close(self._bar)
        self._bar = self._eval_bar = None

    @staticmethod
    def _close(bar: Any) -> None:
        if bar is not None:
            bar.close()


class TQDMProgressBar(ProgressBar):
    """Lightning's name and arguments for the tqdm bar: redrawn every ``refresh_rate`` batches (0: no bar).

    ``ProgressBar`` (the Trainer's default) redraws by time instead, which costs less per step.
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False) -> None:
        from torchfleet.errors import check_int

        check_refresh_rate(self, refresh_rate)
        check_int("process_position", process_position, 0, type(self).__name__)
        super().__init__(refresh_interval=0.0, leave=leave)
        self.refresh_rate = refresh_rate
        self.process_position = process_position
        if refresh_rate == 0:
            self.disable()

    def _new_bar(self, desc: str, total: Any, leave: bool, position: int = 0) -> Any:
        return super()._new_bar(desc, total, leave, position + self.process_position)

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._bar is None:
            return
        self._n += 1
        if self._n % self.refresh_rate == 0:
            self._measure_speed(batch, _clock())
            self._redraw(trainer)


def check_refresh_rate(bar: ProgressBar, refresh_rate: Any) -> None:
    if isinstance(refresh_rate, bool) or not isinstance(refresh_rate, int) or refresh_rate < 0:
        from torchfleet.errors import ConfigurationError

        raise ConfigurationError(
            f"{type(bar).__name__}(refresh_rate={refresh_rate!r}) is not valid: give the number of batches between "
            "redraws (an int >= 1), or 0 for no bar."
        )
