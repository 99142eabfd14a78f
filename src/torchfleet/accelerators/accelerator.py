"""``lightning.pytorch.accelerators.accelerator`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.accelerators.base import Accelerator

__all__ = ['Accelerator']
