"""Strategies: how a model is placed, wrapped, synchronised and checkpointed."""

from torchfleet.strategies._pipeline import PipelineSpec
from torchfleet.strategies.ddp import DDPStrategy
from torchfleet.strategies.deepspeed import DeepSpeedStrategy
from torchfleet.strategies.dp import DataParallelStrategy
from torchfleet.strategies.fsdp import FSDPStrategy
from torchfleet.strategies.model_parallel import ModelParallelStrategy
from torchfleet.strategies.parallel import ParallelStrategy
from torchfleet.strategies.registry import StrategyRegistry
from torchfleet.strategies.single_device import SingleDeviceStrategy
from torchfleet.strategies.strategy import Strategy
from torchfleet.strategies.xla import XLAStrategy

__all__ = ["Strategy", "SingleDeviceStrategy", "ParallelStrategy", "DDPStrategy", "DataParallelStrategy", "StrategyRegistry",
           "DeepSpeedStrategy", "FSDPStrategy", "ModelParallelStrategy", "PipelineSpec", "XLAStrategy"]
