"""Lightning's ``lightning.pytorch.core``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.data import DataModule
from torchfleet.module import Module

__all__ = ["DataModule", "Module"]
