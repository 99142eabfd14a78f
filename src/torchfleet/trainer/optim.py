"""Parsing what ``configure_optimizers`` returns into optimizers and LR-scheduler configurations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from torchfleet.errors import MisconfiguredModuleError
from torchfleet.utilities.types import LRSchedulerConfig

_ACCEPTED = (
    "configure_optimizers() must return one of: an optimizer; a list of optimizers; a tuple "
    "(list of optimizers, list of LR schedulers); a dict {'optimizer': opt, 'lr_scheduler': scheduler or "
    "{'scheduler': scheduler, 'interval': 'step'|'epoch', 'frequency': n, 'monitor': 'metric'}}; or a list of "
    "such dicts"
)

_SCHEDULER_KEYS = {"scheduler", "interval", "frequency", "monitor", "name", "strict", "reduce_on_plateau"}


def _is_torch_scheduler(obj: Any) -> bool:
    return isinstance(obj, (LRScheduler, ReduceLROnPlateau))


def _is_scheduler(obj: Any) -> bool:
    # as Lightning: any object with state_dict/load_state_dict (checkpoints need both); one that is not a torch
    # scheduler is stepped by the Module's lr_scheduler_step (validate_schedulers checks that it is overridden)
    return _is_torch_scheduler(obj) or (
        callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
    )


def _scheduler_config(obj: Any, monitor: str | None = None) -> LRSchedulerConfig:
    if isinstance(obj, Mapping):
        unknown = set(obj) - _SCHEDULER_KEYS
        if unknown or "scheduler" not in obj:
            raise MisconfiguredModuleError(
                f"The lr_scheduler dict from configure_optimizers() has keys {sorted(obj)}: it needs 'scheduler' and "
                f"may hold {sorted(_SCHEDULER_KEYS - {'scheduler'})}"
                + (f"; unknown: {sorted(unknown)}." if unknown else ".")
            )
        config = LRSchedulerConfig(**{"monitor": monitor, **obj})
    elif _is_scheduler(obj):
        config = LRSchedulerConfig(scheduler=obj, monitor=monitor)
    else:
        raise MisconfiguredModuleError(
            f"configure_optimizers() returned {type(obj).__name__} where an LR scheduler was expected. {_ACCEPTED}."
        )
    if not _is_scheduler(config.scheduler):
        raise MisconfiguredModuleError(
            f"lr_scheduler['scheduler'] is a {type(config.scheduler).__name__}, not an LR scheduler (it needs "
            f"state_dict() and load_state_dict()). {_ACCEPTED}."
        )
    if config.interval not in ("step", "epoch"):
        raise MisconfiguredModuleError(
            f"lr_scheduler interval={config.interval!r} is not supported. Accepted values are 'step' and 'epoch'."
        )
    if not isinstance(config.frequency, int) or config.frequency < 1:
        raise MisconfiguredModuleError(f"lr_scheduler frequency must be a positive int, got {config.frequency!r}.")
    config.reduce_on_plateau = isinstance(config.scheduler, ReduceLROnPlateau) or config.reduce_on_plateau
    return config


def validate_schedulers(configs: list[LRSchedulerConfig], automatic: bool, custom_step: bool) -> None:
    """Checks that need the Module: under automatic optimisation the Trainer steps the schedulers, so a
    ReduceLROnPlateau needs a monitor and a non-torch scheduler needs ``lr_scheduler_step`` overridden
    (``custom_step``). In manual optimisation the user steps them: anything stateful is accepted."""
    if not automatic:
        return
    for config in configs:
        if config.reduce_on_plateau and not config.monitor:
            raise MisconfiguredModuleError(
                "configure_optimizers() returned a ReduceLROnPlateau scheduler without a metric to watch. Return "
                "{'optimizer': opt, 'lr_scheduler': {'scheduler': sched, 'monitor': 'val_loss'}}."
            )
        if not custom_step and not _is_torch_scheduler(config.scheduler):
            raise MisconfiguredModuleError(
                f"The LR scheduler {type(config.scheduler).__name__} is not a torch.optim.lr_scheduler.LRScheduler "
                "or ReduceLROnPlateau, so the Trainer does not know how to step it. Override "
                "lr_scheduler_step(self, scheduler, metric) in your Module to step it (as in Lightning), or step it "
                "yourself under manual optimisation (self.automatic_optimization = False)."
            )


def _from_dict(d: Mapping[str, Any]) -> tuple[Optimizer, list[LRSchedulerConfig]]:
    if "optimizer" not in d:
        raise MisconfiguredModuleError(
            f"configure_optimizers() returned a dict with keys {sorted(d)} but no 'optimizer'. {_ACCEPTED}."
        )
    unknown = set(d) - {"optimizer", "lr_scheduler", "monitor"}
    if unknown:
        raise MisconfiguredModuleError(
            f"configure_optimizers() returned a dict with unknown keys {sorted(unknown)}. {_ACCEPTED}."
        )
    opt = d["optimizer"]
    if not isinstance(opt, Optimizer):
        raise MisconfiguredModuleError(
            f"configure_optimizers()['optimizer'] is a {type(opt).__name__}, not a torch.optim.Optimizer."
        )
    sched = d.get("lr_scheduler")
    return opt, ([] if sched is None else [_scheduler_config(sched, d.get("monitor"))])


def parse_optimizers(value: Any) -> tuple[list[Optimizer], list[LRSchedulerConfig]]:
    """Split ``configure_optimizers()``'s return value into optimizers and scheduler configs.

    Raises MisconfiguredModuleError with the accepted forms for anything else.
    """
    if value is None:
        return [], []
    if isinstance(value, Optimizer):
        return [value], []
    if isinstance(value, Mapping):
        opt, scheds = _from_dict(value)
        return [opt], scheds
    if isinstance(value, Sequence) and not isinstance(value, str):
        items = list(value)
        if len(items) == 2 and isinstance(items[0], Sequence) and isinstance(items[1], Sequence):
            opts, scheds = list(items[0]), list(items[1])
            bad = [o for o in opts if not isinstance(o, Optimizer)]
            if bad:
                raise MisconfiguredModuleError(
                    f"configure_optimizers() returned {type(bad[0]).__name__} in the optimizer list. {_ACCEPTED}."
                )
            return opts, [_scheduler_config(s) for s in scheds]
        if items and all(isinstance(o, Optimizer) for o in items):
            return items, []
        if items and all(isinstance(o, Mapping) for o in items):
            pairs = [_from_dict(d) for d in items]
            return [p[0] for p in pairs], [s for p in pairs for s in p[1]]
    raise MisconfiguredModuleError(f"configure_optimizers() returned {value!r}, which is not understood. {_ACCEPTED}.")
