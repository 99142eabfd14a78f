"""LearningRateMonitor: log each optimizer's learning rate (and momentum, weight decay) to the loggers."""

from __future__ import annotations

from typing import Any

from torchfleet.errors import ConfigurationError, check_flag
from torchfleet.trainer.callbacks.base import Callback


class LearningRateMonitor(Callback):
    """Log "lr-<Optimizer>" (suffixed "/pg<i>" per param group when there are several) every step or epoch."""

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False, log_weight_decay: bool = False) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise ConfigurationError(
                f"LearningRateMonitor(logging_interval={logging_interval!r}) is not valid: use None, 'step' or 'epoch'."
            )
        check_flag("log_momentum", log_momentum, "LearningRateMonitor")
        check_flag("log_weight_decay", log_weight_decay, "LearningRateMonitor")
        self.logging_interval = logging_interval
        self.log_momentum, self.log_weight_decay = log_momentum, log_weight_decay
        self.lrs: dict[str, list[float]] = {}

    def _names(self, trainer: Any) -> list[tuple[str, Any]]:
        out, seen = [], {}
        for opt in trainer.optimizers:
            base = f"lr-{type(opt).__name__}"
            seen[base] = seen.get(base, 0) + 1
            name = base if seen[base] == 1 else f"{base}-{seen[base] - 1}"
            out.append((name, opt))
        return out

    def _collect(self, trainer: Any) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for name, opt in self._names(trainer):
            groups = opt.param_groups
            for i, group in enumerate(groups):
                key = name if len(groups) == 1 else f"{name}/pg{i + 1}"
                metrics[key] = float(group["lr"])
                if self.log_momentum:
                    momentum = group.get("momentum", group.get("betas", (None,))[0])
                    if momentum is not None:
                        metrics[key.replace("lr-", "momentum-", 1)] = float(momentum)
                if self.log_weight_decay and "weight_decay" in group:
                    metrics[key.replace("lr-", "weight_decay-", 1)] = float(group["weight_decay"])
        return metrics

    def _log(self, trainer: Any) -> None:
        metrics = self._collect(trainer)
        for key, value in metrics.items():
            if key.startswith("lr-"):
                self.lrs.setdefault(key, []).append(value)
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.log_metrics(metrics, step=trainer.global_step)

    def _interval(self, trainer: Any) -> str:
        if self.logging_interval is not None:
            return self.logging_interval
        intervals = {c.interval for c in trainer.lr_scheduler_configs}
        return "step" if "step" in intervals else "epoch"

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if self._interval(trainer) == "step" and trainer.global_step % trainer.log_every_n_steps == 0:
            self._log(trainer)

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        if self._interval(trainer) == "epoch":
            self._log(trainer)
