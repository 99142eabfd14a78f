"""The Trainer, its loops, self.log results and callbacks.

``from torchfleet.trainer import Trainer, seed_everything`` works as Lightning's ``lightning.pytorch.trainer``; the
names are looked up on first use, so importing one of the loops' modules does not import the Trainer.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Trainer", "seed_everything"]

_LAZY = {"Trainer": "torchfleet.trainer.trainer", "seed_everything": "torchfleet.seed"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchfleet.trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
