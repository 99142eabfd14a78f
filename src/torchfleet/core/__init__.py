"""``lightning.pytorch.core`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.data import DataModule
from torchfleet.module import Module

__all__ = ['DataModule', 'Module']
