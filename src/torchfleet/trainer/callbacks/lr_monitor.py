"""LearningRateMonitor: log each optimizer's learning rate (and momentum, weight decay) to the loggers."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from torchfleet.errors import ConfigurationError, check_flag
from torchfleet.trainer.callbacks.base import Callback


class LearningRateMonitor(Callback):
    """Log every optimizer's learning rate each step or epoch, under Lightning's names.

    An optimizer is logged as "lr-<Optimizer class>" (its scheduler's ``name`` when the scheduler config gives
    one), further optimizers of the same class as "lr-<class>-1", "lr-<class>-2", ...; an optimizer with several
    param groups as "<name>/<group's "name">" or "<name>/pg<i>" (a single group: "<name>/<its "name">" where it has
    one). With ``log_momentum`` / ``log_weight_decay``,
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
        #: training batches after which an optimizer stepped (Lightning's logging cadence counts them)
        self._stepped, self._last_step = 0, 0

    def _names(self, trainer: Any) -> list[tuple[Any, list[str], str | None]]:
        """(optimizer, one name per param group, its scheduler's interval or None), optimizers with a scheduler
        first, as Lightning orders them."""
        configs = {id(c.scheduler.optimizer): c for c in trainer.lr_scheduler_configs
                   if getattr(c.scheduler, "optimizer", None) is not None}
        order = sorted(trainer.optimizers, key=lambda o: id(o) not in configs)
        out, seen = [], {}
        for opt in order:
            config = configs.get(id(opt))
            base = (config.name if config is not None else None) or f"lr-{type(opt).__name__}"
            seen[base] = seen.get(base, 0) + 1
            name = base if seen[base] == 1 else f"{base}-{seen[base] - 1}"
            groups = opt.param_groups
            interval = config.interval if config is not None else None
            if len(groups) == 1:  # a named single group is logged under its name too, as Lightning
                out.append((opt, [f"{name}/{groups[0]['name']}" if groups[0].get("name") else name], interval))
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
            out.append((opt, [f"{name}/{label}" for label in labels], interval))
        return out

    def on_train_start(self, trainer: Any, module: Any) -> None:
        if not trainer.loggers:
            raise ConfigurationError(
                "LearningRateMonitor logs to the Trainer's loggers, but this Trainer has none (logger=False): it "
                "cannot be used with a `Trainer` that has no logger. Pass a logger (logger=True or e.g. "
                "CSVLogger(...)), or remove the LearningRateMonitor."
            )
        names = [name for _, group_names, _ in self._names(trainer) for name in group_names]
        self._stepped, self._last_step = 0, trainer.global_step
        if self.log_momentum and any("momentum" not in o.defaults and "betas" not in o.defaults
                                     for o in trainer.optimizers):
            warnings.warn("LearningRateMonitor(log_momentum=True): some optimizers do not have momentum (neither "
                          "momentum nor betas); their momentum is logged as 0.", RuntimeWarning, stacklevel=2)
        self.lrs = {name: self.lrs.get(name, []) for name in names}
        self.last_momentum_values = {f"{name}-momentum": None for name in names}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in names}

    def _collect(self, trainer: Any, interval: str) -> dict[str, float]:
        """The values of the optimizers whose scheduler steps at ``interval`` ("any": all), and of those without one."""
        metrics: dict[str, float] = {}
        for opt, group_names, sched_interval in self._names(trainer):
            for name in group_names:  # a group added since (finetuning): "x" continues as "x/pg1", as Lightning
                if name.endswith("/pg1") and name[:-4] in self.lrs:
                    self.lrs[name] = self.lrs.pop(name[:-4])
                self.lrs.setdefault(name, [])
            if sched_interval is not None and interval not in ("any", sched_interval):
                continue
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

    def _log(self, trainer: Any, interval: str) -> None:
        metrics = self._collect(trainer, interval)
        for key, value in metrics.items():
            if not key.endswith(("-momentum", "-weight_decay")):
                self.lrs[key].append(value)
            # as Lightning: callbacks (EarlyStopping, ModelCheckpoint) may monitor them
            trainer.state.epoch_metrics[key] = torch.tensor(value)
        if metrics and trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.log_metrics(metrics, step=trainer.global_step)

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        # Lightning's cadence: every log_every_n_steps training batches after which an optimizer stepped
        every = trainer.log_every_n_steps
        if self.logging_interval != "epoch" and every and ((self._stepped + 1) % every == 0 or trainer.should_stop):
            self._log(trainer, "step" if self.logging_interval is None else "any")

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self._last_step:
            self._stepped, self._last_step = self._stepped + 1, trainer.global_step

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        if self.logging_interval != "step":
            self._log(trainer, "epoch" if self.logging_interval is None else "any")
