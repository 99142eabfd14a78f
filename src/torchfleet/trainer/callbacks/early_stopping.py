"""EarlyStopping: stop when a monitored metric stops improving (the same decision on every rank)."""

from __future__ import annotations

import enum
import logging
import math
from typing import Any

import torch

from torchfleet.errors import ConfigurationError, check_flag, check_int, check_number, check_text
from torchfleet.trainer.callbacks.base import Callback

log = logging.getLogger("torchfleet")


class EarlyStoppingReason(enum.Enum):
    """Why EarlyStopping stopped the run (``early_stopping.stopping_reason``); Lightning's names and values."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    """Stop training after ``patience`` checks without an improvement of at least ``min_delta`` in ``monitor``.

    After a stop, ``stopping_reason`` (an ``EarlyStoppingReason``) says why and ``stopping_reason_message``
    says it in words.
    """

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
    ) -> None:
        owner = "EarlyStopping"
        check_text("monitor", monitor, owner, meaning="the name of a logged metric")
        check_number("min_delta", min_delta, owner=owner, meaning="the least change that counts as an improvement")
        check_int("patience", patience, 0, owner, meaning="checks without an improvement before training stops")
        for name, flag in (("verbose", verbose), ("strict", strict), ("check_finite", check_finite)):
            check_flag(name, flag, owner)
        check_flag("check_on_train_epoch_end", check_on_train_epoch_end, owner, allow_none=True)
        check_number("stopping_threshold", stopping_threshold, owner=owner, allow_none=True)
        check_number("divergence_threshold", divergence_threshold, owner=owner, allow_none=True)
        if mode not in ("min", "max"):
            raise ConfigurationError(f"EarlyStopping(mode={mode!r}) is not valid: use 'min' or 'max'.")
        self.monitor, self.mode, self.patience = monitor, mode, patience
        self.min_delta = abs(min_delta) * (1 if mode == "max" else -1)
        self.verbose, self.strict, self.check_finite = verbose, strict, check_finite
        self.stopping_threshold, self.divergence_threshold = stopping_threshold, divergence_threshold
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self.wait_count = 0
        self.stopped_epoch = 0
        self.best_score = torch.tensor(math.inf if mode == "min" else -math.inf)
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)

    def state_dict(self) -> dict[str, Any]:
        return {"wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch, "best_score": self.best_score,
                "patience": self.patience, "stopping_reason": self.stopping_reason.value,
                "stopping_reason_message": self.stopping_reason_message}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = state_dict["wait_count"]
        self.stopped_epoch = state_dict["stopped_epoch"]
        self.best_score = state_dict["best_score"]
        self.stopping_reason = EarlyStoppingReason(state_dict.get("stopping_reason", 0))
        self.stopping_reason_message = state_dict.get("stopping_reason_message")

    def _on_train_end_check(self, trainer: Any) -> bool:
        if self.check_on_train_epoch_end is not None:
            return self.check_on_train_epoch_end
        # validation exists: check after it; else after the training epoch
        return not any(trainer.num_val_batches)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if self._on_train_end_check(trainer):
            self._check(trainer)

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit" and not self._on_train_end_check(trainer):
            self._check(trainer)

    def _improved(self, current: torch.Tensor) -> bool:
        if self.mode == "min":
            return bool(current < self.best_score.to(current.device) + self.min_delta)
        return bool(current > self.best_score.to(current.device) + self.min_delta)

    def _check(self, trainer: Any) -> None:
        if trainer.fast_dev_run:  # as Lightning: a run of a few batches to try the code decides nothing
            return
        metrics = trainer.callback_metrics
        # rank 0's value decides for everyone, so every rank stops at the same step
        local = metrics.get(self.monitor)
        value = trainer.strategy.broadcast(None if local is None else float(local), src=0)
        if value is None:
            if self.strict:
                raise ConfigurationError(
                    f"EarlyStopping watches {self.monitor!r}, which was not logged. Logged metrics: "
                    f"{', '.join(sorted(metrics)) or 'none'}. Log it with self.log, or pass strict=False."
                )
            return
        current = torch.as_tensor(value).float()
        reason, message = self._evaluate(current)
        # every rank saw rank 0's value, so every rank takes the same decision
        if reason is not EarlyStoppingReason.NOT_STOPPED:
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason, self.stopping_reason_message = reason, message
            if trainer.is_global_zero:
                log.info("EarlyStopping: %s", message)

    def _evaluate(self, current: torch.Tensor) -> tuple[EarlyStoppingReason, str | None]:
        if self.check_finite and not torch.isfinite(current):
            return EarlyStoppingReason.NON_FINITE_METRIC, f"{self.monitor} = {float(current)} is not finite; stopping."
        if self.stopping_threshold is not None and (
            current < self.stopping_threshold if self.mode == "min" else current > self.stopping_threshold
        ):
            return EarlyStoppingReason.STOPPING_THRESHOLD, (
                f"{self.monitor} = {float(current):.6g} reached the stopping threshold {self.stopping_threshold}.")
        if self.divergence_threshold is not None and (
            current > self.divergence_threshold if self.mode == "min" else current < self.divergence_threshold
        ):
            return EarlyStoppingReason.DIVERGENCE_THRESHOLD, (
                f"{self.monitor} = {float(current):.6g} crossed the divergence threshold {self.divergence_threshold}.")
        if self._improved(current):
            self.best_score = current
            self.wait_count = 0
            return EarlyStoppingReason.NOT_STOPPED, None
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return EarlyStoppingReason.PATIENCE_EXHAUSTED, (
                f"{self.monitor} did not improve for {self.wait_count} checks; best {float(self.best_score):.6g}.")
        return EarlyStoppingReason.NOT_STOPPED, None
