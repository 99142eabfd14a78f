"""StrategyRegistry: strategy names -> (class, init kwargs, description)."""

from __future__ import annotations

from torchfleet._registry import Registry
from torchfleet.strategies.base import SingleDeviceStrategy, Strategy


class _StrategyRegistry(Registry[Strategy]):
    """Strategy names -> (class, init kwargs, description)."""

    def available_strategies(self) -> list[str]:
        """Registered strategy names, sorted."""
        return self.available()


#: The registry behind ``Trainer(strategy="name")``. Packages add entries through the
#: ``torchfleet.strategies`` entry-point group.
StrategyRegistry = _StrategyRegistry("strategy", "torchfleet.strategies", base=Strategy)

StrategyRegistry.register(
    "single_device", SingleDeviceStrategy, description="Train in one process on one device (CPU, one GPU or MPS)."
)
