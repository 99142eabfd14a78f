"""``lightning.fabric.wrappers`` under torchfleet's name: what ``Fleet.setup*`` returns, and ``is_wrapped``."""

from __future__ import annotations

from typing import Any

from torchfleet.compiled import uncompiled
from torchfleet.fleet_wrappers import FleetDataLoader, FleetModule, FleetOptimizer

__all__ = ["FleetDataLoader", "FleetModule", "FleetOptimizer", "is_wrapped"]


def is_wrapped(obj: Any) -> bool:
    """Whether ``obj`` came out of ``Fleet.setup``/``setup_module``/``setup_optimizers``/``setup_dataloaders``.

    A ``torch.compile``'d FleetModule counts too (Fleet compiles the wrapper, not the module inside it)."""
    return isinstance(uncompiled(obj), (FleetModule, FleetOptimizer, FleetDataLoader))
