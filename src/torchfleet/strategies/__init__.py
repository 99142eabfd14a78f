"""Strategies: how a model is placed, wrapped, synchronised and checkpointed."""

from torchfleet.strategies.base import ParallelStrategy, SingleDeviceStrategy, Strategy
from torchfleet.strategies.ddp import DDPStrategy
from torchfleet.strategies.deepspeed import DeepSpeedStrategy
from torchfleet.strategies.dp import DataParallelStrategy
from torchfleet.strategies.fsdp import FSDPStrategy
from torchfleet.strategies.registry import StrategyRegistry

__all__ = ["Strategy", "SingleDeviceStrategy", "ParallelStrategy", "DDPStrategy", "DataParallelStrategy", "StrategyRegistry",
           "DeepSpeedStrategy", "FSDPStrategy"]
