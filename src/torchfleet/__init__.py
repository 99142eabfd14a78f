"""torchfleet: train PyTorch models on one device, many processes or many machines.

Change ``strategy=``, ``devices=`` and ``num_nodes=``; never the model code. Public names are
imported on first use, so ``import torchfleet`` costs little more than ``import torch``.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# as Lightning's loggers: torchfleet's info lines ("Seed set to 42", the strategy chosen) pass on to the program's
# logging handlers unless the program set this logger's level itself (the Trainer adds a handler where none exists)
if logging.getLogger(__name__).level == logging.NOTSET:
    logging.getLogger(__name__).setLevel(logging.INFO)

_LAZY = {
    "Trainer": "torchfleet.trainer.trainer",
    "seed_everything": "torchfleet.seed",
    "reset_seed": "torchfleet.seed",
    "isolate_rng": "torchfleet.seed",
    "worker_init_function": "torchfleet.seed",
    "Callback": "torchfleet.trainer.callbacks.base",
    "Module": "torchfleet.module",
    "DataModule": "torchfleet.data",
    "Fleet": "torchfleet.fleet",
    "is_wrapped": "torchfleet.wrappers",
    "ConfigurationError": "torchfleet.errors",
    "CheckpointError": "torchfleet.errors",
    "TrainingSettings": "torchfleet.settings",
    "Preempted": "torchfleet.preemption",
    "cli_logo": "torchfleet.rank_zero",
    "cli_lightning_logo": "torchfleet.rank_zero",
    "estimate_memory": "torchfleet.planner.estimate",
    "MemoryEstimate": "torchfleet.planner.estimate",
}

#: subpackages reachable as attributes after a plain ``import torchfleet`` (``torchfleet.strategies.DDPStrategy``)
_SUBMODULES = ("accelerators", "callbacks", "checkpoint", "core", "demos", "environments", "launchers", "loggers",
               "plugins", "precision", "profilers", "strategies", "utilities")

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"torchfleet.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchfleet' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from torchfleet.data import DataModule
    from torchfleet.errors import CheckpointError, ConfigurationError
    from torchfleet.fleet import Fleet
    from torchfleet.module import Module
    from torchfleet.planner.estimate import MemoryEstimate, estimate_memory
    from torchfleet.preemption import Preempted
    from torchfleet.rank_zero import cli_lightning_logo, cli_logo
    from torchfleet.seed import isolate_rng, reset_seed, seed_everything, worker_init_function
    from torchfleet.settings import TrainingSettings
    from torchfleet.trainer.callbacks.base import Callback
    from torchfleet.trainer.trainer import Trainer
    from torchfleet.wrappers import is_wrapped
