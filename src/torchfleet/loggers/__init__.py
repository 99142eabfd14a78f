"""Loggers shipped with torchfleet."""

from torchfleet.trainer.loggers.base import Logger
from torchfleet.trainer.loggers.csv import CSVLogger
from torchfleet.trainer.loggers.tensorboard import TensorBoardLogger

__all__ = ["Logger", "CSVLogger", "TensorBoardLogger"]
