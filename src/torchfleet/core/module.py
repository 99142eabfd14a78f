"""Lightning's ``lightning.pytorch.core.module``, its names under torchfleet's (docs/porting.md)."""

from __future__ import annotations

from typing import Union

from torch.optim import Optimizer

from torchfleet.module import Module
from torchfleet.optim_wrapper import OptimizerWrapper

__all__ = ["MODULE_OPTIMIZERS", "Module"]

#: what ``Module.optimizers()`` returns: one optimizer (wrapped by the Trainer or Fleet, or not) or a list of them
MODULE_OPTIMIZERS = Union[Optimizer, OptimizerWrapper, list[Optimizer], list[OptimizerWrapper]]
