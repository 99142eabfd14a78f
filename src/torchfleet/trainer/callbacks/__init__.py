"""Callbacks shipped with torchfleet."""

from torchfleet.trainer.callbacks.base import Callback
from torchfleet.trainer.callbacks.checkpoint import ModelCheckpoint
from torchfleet.trainer.callbacks.early_stopping import EarlyStopping
from torchfleet.trainer.callbacks.lr_monitor import LearningRateMonitor
from torchfleet.trainer.callbacks.progress import ProgressBar
from torchfleet.trainer.callbacks.throughput import ThroughputMonitor
from torchfleet.trainer.callbacks.timer import Timer

__all__ = ["Callback", "ModelCheckpoint", "EarlyStopping", "ProgressBar", "LearningRateMonitor", "ThroughputMonitor", "Timer"]
