"""Public loggers: ``from torchfleet.loggers import CSVLogger, TensorBoardLogger``."""

from torchfleet.trainer.loggers import CSVLogger, Logger, TensorBoardLogger

__all__ = ["Logger", "CSVLogger", "TensorBoardLogger"]
