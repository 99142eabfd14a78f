"""Lightning's ``utilities.types``: the type aliases of hook signatures (``STEP_OUTPUT``, ``OptimizerLRScheduler``,
...) and ``LRSchedulerConfig``, the Trainer's record of one LR scheduler."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, runtime_checkable

import torch
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

# Fabric's names (lightning.fabric.utilities.types): torch's distributed types, and what Fleet wraps as an optimizer
UntypedStorage = torch.UntypedStorage
DistributedDataParallel = torch.nn.parallel.DistributedDataParallel
if torch.distributed.is_available():
    from torch.distributed import ProcessGroup, ReduceOp

    RedOpType = ReduceOp.RedOpType
else:  # a torch built without distributed support
    ProcessGroup = ReduceOp = RedOpType = Any  # type: ignore[misc,assignment]
#: what the collectives take as ``group``
CollectibleGroup = ProcessGroup


@runtime_checkable
class Steppable(Protocol):
    """Something with ``step(closure=None)``."""

    def step(self, closure: Any = None) -> Any: ...


@runtime_checkable
class Optimizable(Steppable, Protocol):
    """What an optimizer offers: ``step``, its groups, defaults and state, and their state dict."""

    param_groups: list[dict[Any, Any]]
    defaults: dict[Any, Any]
    state: Any

    def state_dict(self) -> dict[str, dict[Any, Any]]: ...

    def load_state_dict(self, state_dict: dict[str, dict[Any, Any]]) -> None: ...


__all__ = ["CollectibleGroup", "DistributedDataParallel", "Optimizable", "ProcessGroup", "RedOpType", "ReduceOp",
           "Steppable", "UntypedStorage", "STEP_OUTPUT", "TRAIN_DATALOADERS", "EVAL_DATALOADERS", "LRSchedulerTypeTuple", "LRSchedulerTypeUnion",
           "LRSchedulerType", "LRSchedulerPLType", "LRSchedulerConfig", "LRSchedulerConfigType", "OptimizerConfig",
           "OptimizerLRSchedulerConfig", "OptimizerLRScheduler"]
