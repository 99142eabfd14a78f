"""``lightning.pytorch.core.datamodule`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.data import DataModule

__all__ = ['DataModule']
