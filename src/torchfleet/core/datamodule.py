"""Lightning's ``lightning.pytorch.core.datamodule``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.data import DataModule

__all__ = ["DataModule"]
