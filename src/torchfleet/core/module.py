"""``lightning.pytorch.core.module`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.module import Module

__all__ = ['Module']
