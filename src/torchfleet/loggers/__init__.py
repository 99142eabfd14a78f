"""Loggers for the Trainer and Fleet alike: ``from torchfleet.loggers import CSVLogger, TensorBoardLogger``.

MLflowLogger and WandbLogger need their optional packages (``pip install torchfleet[mlflow]`` / ``[wandb]``),
imported only when one is created.
"""

from torchfleet.loggers.base import Logger, load_hparams_from_yaml, save_hparams_to_yaml
from torchfleet.loggers.csv import CSVLogger
from torchfleet.loggers.mlflow import MLflowLogger
from torchfleet.loggers.tensorboard import TensorBoardLogger
from torchfleet.loggers.wandb import WandbLogger

__all__ = ["Logger", "CSVLogger", "TensorBoardLogger", "MLflowLogger", "WandbLogger", "load_hparams_from_yaml",
           "save_hparams_to_yaml"]
