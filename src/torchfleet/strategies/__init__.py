"""Strategies: how a model is placed, wrapped, synchronised and checkpointed."""

from torchfleet.strategies.base import ParallelStrategy, SingleDeviceStrategy, Strategy
from torchfleet.strategies.registry import StrategyRegistry

__all__ = ["Strategy", "SingleDeviceStrategy", "ParallelStrategy", "StrategyRegistry"]
