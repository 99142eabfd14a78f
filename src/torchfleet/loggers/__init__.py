"""Loggers for the Trainer and Fleet alike: ``from torchfleet.loggers import CSVLogger, TensorBoardLogger``."""

from torchfleet.loggers.base import Logger
from torchfleet.loggers.csv import CSVLogger
from torchfleet.loggers.tensorboard import TensorBoardLogger

__all__ = ["Logger", "CSVLogger", "TensorBoardLogger"]
