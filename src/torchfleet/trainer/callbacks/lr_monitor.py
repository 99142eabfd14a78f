"""LearningRateMonitor: log each optimizer's learning rate (and momentum, weight decay) to the loggers."""

from __future__ import annotations

import warnings
from typing import Any

from torchfleet.errors import ConfigurationError, check_flag
from torchfleet.trainer.callbacks.base import Callback


class LearningRateMonitor(Callback):
    """Log every optimizer's learning rate each step or epoch, under Lightning's names.

    An optimizer is logged as "lr-<Optimizer class>" (its scheduler's ``name`` when the scheduler config gives
    one), further optimizers of the same class as "lr-<class>-1", "lr-<class>-2", ...; an optimizer with several
    param groups as "<name>/<group's "name">" or "<name>/pg<i>". With ``log_momentum`` / ``log_weight_decay``,
    "<name>-momentum" (``momentum``, or the first of Adam's ``betas``; 0 where the optimizer has neither) and
    "<name>-weight_decay" are logged too. ``lrs`` keeps every logged rate, ``last_momentum_values`` and
    ``last_weight_decay_values`` the latest of the others (None until logged).
    """

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
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}

    def _names(self, trainer: Any) -> list[tuple[Any, list[str]]]:
        """(optimizer, one name per param group), optimizers with a scheduler first, as Lightning orders them."""
        named = {id(c.scheduler.optimizer): c.name for c in trainer.lr_scheduler_configs
                 if getattr(c.scheduler, "optimizer", None) is not None}
        order = sorted(trainer.optimizers, key=lambda o: id(o) not in named)
        out, seen = [], {}
        for opt in order:
            base = named.get(id(opt)) or f"lr-{type(opt).__name__}"
            seen[base] = seen.get(base, 0) + 1
            name = base if seen[base] == 1 else f"{base}-{seen[base] - 1}"
            groups = opt.param_groups
            if len(groups) == 1:
                out.append((opt, [name]))
                continue
            labels = [str(g.get("name", f"pg{i + 1}")) for i, g in enumerate(groups)]
            repeated = sorted({label for label in labels if labels.count(label) > 1})
            if repeated:
                raise ConfigurationError(
                    f"LearningRateMonitor: the param groups of {type(opt).__name__} share the name(s) {repeated}, so "
                    "their learning rates would be logged under one key (A single `Optimizer` cannot have multiple "
                    "parameter groups with identical names). Give each group a distinct 'name' (or none: unnamed "
                    "groups are logged as pg1, pg2, ...)."
                )
            out.append((opt, [f"{name}/{label}" for label in labels]))
        return out

    def on_train_start(self, trainer: Any, module: Any) -> None:
        if not trainer.loggers:
            raise ConfigurationError(
                "LearningRateMonitor logs to the Trainer's loggers, but this Trainer has none (logger=False): it "
                "cannot be used with a `Trainer` that has no logger. Pass a logger (logger=True or e.g. "
                "CSVLogger(...)), or remove the LearningRateMonitor."
            )
        names = [name for _, group_names in self._names(trainer) for name in group_names]
        if self.log_momentum and any("momentum" not in o.defaults and "betas" not in o.defaults
                                     for o in trainer.optimizers):
            warnings.warn("LearningRateMonitor(log_momentum=True): some optimizers do not have momentum (neither "
                          "momentum nor betas); their momentum is logged as 0.", RuntimeWarning, stacklevel=2)
        self.lrs = {name: self.lrs.get(name, []) for name in names}
        self.last_momentum_values = {f"{name}-momentum": None for name in names}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in names}

    def _collect(self, trainer: Any) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for opt, group_names in self._names(trainer):
            betas = "betas" in opt.defaults
            for group, name in zip(opt.param_groups, group_names):
                metrics[name] = float(group["lr"])
                if self.log_momentum:
                    momentum = group["betas"][0] if betas else group.get("momentum", 0)
                    metrics[f"{name}-momentum"] = self.last_momentum_values[f"{name}-momentum"] = float(momentum)
                if self.log_weight_decay and "weight_decay" in group:
                    wd = float(group["weight_decay"])
                    metrics[f"{name}-weight_decay"] = self.last_weight_decay_values[f"{name}-weight_decay"] = wd
        return metrics

    def _log(self, trainer: Any) -> None:
        metrics = self._collect(trainer)
        for key, value in metrics.items():
            if not key.endswith(("-momentum", "-weight_decay")):
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
