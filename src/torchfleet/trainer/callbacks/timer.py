"""Timer: stop training once a time budget is spent (what ``Trainer(max_time=...)`` adds)."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from torchfleet.errors import ConfigurationError, check_flag
from torchfleet.trainer.callbacks.base import Callback

log = logging.getLogger("torchfleet")

#: the clock the budget is read from (monotonic: a change of the wall clock does not end a run)
_now = time.monotonic


def parse_duration(duration: Any) -> float | None:
    """Seconds in ``duration``: "DD:HH:MM:SS", a ``timedelta``, a dict of ``timedelta`` arguments, or None."""
    if duration is None:
        return None
    parsed: Any = duration
    try:
        if isinstance(duration, str):
            days, hours, minutes, seconds = (int(part) for part in duration.strip().split(":"))
            parsed = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        elif isinstance(duration, dict):
            parsed = timedelta(**duration)
    except (TypeError, ValueError):
        parsed = None
    if not isinstance(parsed, timedelta) or parsed.total_seconds() < 0:
        raise ConfigurationError(
            f"The time budget {duration!r} (max_time, or Timer's duration) is not a duration: give a string "
            "\"DD:HH:MM:SS\" (e.g. \"00:12:00:00\" for 12 hours), a datetime.timedelta, or a dict of timedelta "
            "arguments such as {\"hours\": 12}."
        )
    return parsed.total_seconds()


class Timer(Callback):
    """Stop training once ``duration`` has passed, checked after every step (``interval="step"``) or epoch.

    The time already spent is saved in checkpoints, so a resumed run gets what is left of the budget.
    Every rank stops at the same step: rank 0's clock decides.
    """

    def __init__(self, duration: Any = None, interval: str = "step", verbose: bool = True) -> None:
        if interval not in ("step", "epoch"):
            raise ConfigurationError(f"Timer(interval={interval!r}) is not valid: use 'step' or 'epoch'.")
        check_flag("verbose", verbose, "Timer")
        self.duration = parse_duration(duration)
        self.interval, self.verbose = interval, verbose
        self._start: float | None = None
        self._end: float | None = None
        self._offset = 0.0  # seconds spent by the runs this one resumes

    def time_elapsed(self) -> float:
        """Seconds spent training, including those of the runs resumed from."""
        if self._start is None:
            return self._offset
        return self._offset + ((self._end if self._end is not None else _now()) - self._start)

    def time_remaining(self) -> float | None:
        """Seconds left of the budget (None without one)."""
        return None if self.duration is None else self.duration - self.time_elapsed()

    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": self.time_elapsed()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = float(state_dict.get("time_elapsed", 0.0))

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self._start, self._end = _now(), None

    def on_train_end(self, trainer: Any, module: Any) -> None:
        self._end = _now()

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.interval == "step":
            self._check(trainer)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if self.interval == "epoch":
            self._check(trainer)

    def _check(self, trainer: Any) -> None:
        if self.duration is None or trainer.should_stop:
            return
        if trainer.strategy.broadcast(self.time_elapsed() >= self.duration, src=0):
            trainer.should_stop = True
            if self.verbose and trainer.is_global_zero:
                log.info("Timer: the time budget of %s is spent; stopping.", timedelta(seconds=self.duration))
