"""Timer: stop training once a time budget is spent (what ``Trainer(max_time=...)`` adds)."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from torchfleet.errors import ConfigurationError, check_flag
from torchfleet.trainer.callbacks.base import Callback
from torchfleet.utilities.enums import LightningEnum

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
            f"The time budget {duration!r} (max_time, or Timer's duration) is not a duration: give a string in the "
            "format DD:HH:MM:SS (e.g. \"00:12:00:00\" for 12 hours), a datetime.timedelta, or a dict of timedelta "
            "arguments such as {\"hours\": 12}."
        )
    return parsed.total_seconds()


#: the stages a Timer clocks (Lightning's RunningStage values); the budget applies to "train"
STAGES = ("train", "validate", "test", "predict")


class Interval(LightningEnum):
    """When a Timer checks its duration: after every optimizer step or after every epoch (equal to the strings)."""

    step = "step"
    epoch = "epoch"


class Timer(Callback):
    """Stop training once ``duration`` has passed, checked after every step (``interval="step"``) or epoch.

    The time already spent training is saved in checkpoints, so a resumed run gets what is left of the budget.
    Every rank stops at the same step: rank 0's clock decides. Validation (the sanity check's too, as Lightning),
    test and predict are clocked too (``time_elapsed("validate")``), outside the budget.
    """

    def __init__(self, duration: Any = None, interval: str = "step", verbose: bool = True) -> None:
        if interval not in ("step", "epoch"):
            # "Unsupported parameter value" is Lightning's key phrase
            raise ConfigurationError(
                f"Unsupported parameter value `Timer(interval={interval!r})`: it is not valid; use 'step' (check the "
                "budget after every training step) or 'epoch' (after every training epoch)."
            )
        check_flag("verbose", verbose, "Timer")
        #: the budget in seconds (None: none); ``_duration`` is the name Lightning's Timer keeps it under
        self._duration = parse_duration(duration)
        self.interval, self.verbose = str(interval), verbose  # an Interval member becomes its plain string
        self._start: dict[str, float | None] = dict.fromkeys(STAGES)
        self._end: dict[str, float | None] = dict.fromkeys(STAGES)
        self._offset = 0.0  # seconds spent training by the runs this one resumes

    @property
    def duration(self) -> float | None:
        """The time budget in seconds, None without one."""
        return self._duration

    @staticmethod
    def _stage(stage: str) -> str:
        stage = str(stage)
        if stage not in STAGES:
            raise ConfigurationError(f"Timer stage {stage!r} is not one it clocks: use one of {', '.join(STAGES)}.")
        return stage

    def start_time(self, stage: str = "train") -> float | None:
        """When ``stage`` last started (``time.monotonic()``), None before it ran."""
        return self._start[self._stage(stage)]

    def end_time(self, stage: str = "train") -> float | None:
        """When ``stage`` last ended, None before it ended (or while it runs)."""
        return self._end[self._stage(stage)]

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds ``stage`` ran (its latest run); for "train", plus those of the runs resumed from."""
        stage = self._stage(stage)
        offset = self._offset if stage == "train" else 0.0
        start, end = self._start[stage], self._end[stage]
        if start is None:
            return offset
        return offset + ((end if end is not None else _now()) - start)

    def time_remaining(self, stage: str = "train") -> float | None:
        """Seconds left of the budget (None without one)."""
        return None if self.duration is None else self.duration - self.time_elapsed(stage)

    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": self.time_elapsed()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = float(state_dict.get("time_elapsed", 0.0))

    def _begin(self, stage: str) -> None:
        self._start[stage], self._end[stage] = _now(), None

    def _finish(self, stage: str) -> None:
        self._end[stage] = _now()

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        # as Lightning: once a checkpoint is restored, a budget it had already spent stops fit before its first step
        self._check(trainer)

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self._begin("train")

    def on_train_end(self, trainer: Any, module: Any) -> None:
        self._finish("train")

    # as Lightning, the sanity check's validation is clocked as validation
    def on_validation_start(self, trainer: Any, module: Any) -> None:
        self._begin("validate")

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        self._finish("validate")

    def on_test_start(self, trainer: Any, module: Any) -> None:
        self._begin("test")

    def on_test_end(self, trainer: Any, module: Any) -> None:
        self._finish("test")

    def on_predict_start(self, trainer: Any, module: Any) -> None:
        self._begin("predict")

    def on_predict_end(self, trainer: Any, module: Any) -> None:
        self._finish("predict")

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
                # "Time limit reached." and "Signaling Trainer to stop." are Lightning's phrases (log filters)
                log.info("Time limit reached. Timer: the time budget of %s is spent. Signaling Trainer to stop.",
                         timedelta(seconds=self.duration))
