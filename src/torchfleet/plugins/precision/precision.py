"""``lightning.pytorch.plugins.precision.precision`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.precision import Precision

__all__ = ['Precision']
