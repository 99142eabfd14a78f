"""Lightning's ``utilities.types``: the type aliases of hook signatures (``STEP_OUTPUT``, ``OptimizerLRScheduler``,
...) and ``LRSchedulerConfig``, the Trainer's record of one LR scheduler."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

_NUMBER = int | float
STEP_OUTPUT = Tensor | Mapping[str, Any] | None
TRAIN_DATALOADERS = Any  # a DataLoader or any collection of them
EVAL_DATALOADERS = Any
_EVALUATE_OUTPUT = list[Mapping[str, float]]  # one dict per dataloader
_PREDICT_OUTPUT = list[Any] | list[list[Any]]

LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = LRScheduler | ReduceLROnPlateau
LRSchedulerType = type[LRScheduler] | type[ReduceLROnPlateau]
LRSchedulerPLType = LRSchedulerTypeUnion


@dataclass
class LRSchedulerConfig:
    """One LR scheduler and when to step it (Lightning's fields, in Lightning's order)."""

    scheduler: Any
    name: str | None = None
    interval: str = "epoch"
    frequency: int = 1
    reduce_on_plateau: bool = False
    monitor: str | None = None
    strict: bool = True

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()


class LRSchedulerConfigType(TypedDict, total=False):
    """The ``"lr_scheduler"`` dict ``configure_optimizers`` may return."""

    scheduler: LRSchedulerTypeUnion
    name: str | None
    interval: str
    frequency: int
    reduce_on_plateau: bool
    monitor: str | None
    strict: bool


class OptimizerConfig(TypedDict):
    optimizer: Optimizer


class OptimizerLRSchedulerConfig(TypedDict, total=False):
    optimizer: Optimizer
    lr_scheduler: LRSchedulerTypeUnion | LRSchedulerConfigType
    monitor: str


#: what ``configure_optimizers`` may return
OptimizerLRScheduler = (
    Optimizer
    | Sequence[Optimizer]
    | tuple[Sequence[Optimizer], Sequence[LRSchedulerTypeUnion | LRSchedulerConfig]]
    | OptimizerConfig
    | OptimizerLRSchedulerConfig
    | Sequence[OptimizerConfig]
    | Sequence[OptimizerLRSchedulerConfig]
    | None
)

__all__ = ["STEP_OUTPUT", "TRAIN_DATALOADERS", "EVAL_DATALOADERS", "LRSchedulerTypeTuple", "LRSchedulerTypeUnion",
           "LRSchedulerType", "LRSchedulerPLType", "LRSchedulerConfig", "LRSchedulerConfigType", "OptimizerConfig",
           "OptimizerLRSchedulerConfig", "OptimizerLRScheduler"]
