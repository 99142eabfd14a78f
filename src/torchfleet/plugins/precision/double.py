"""``lightning.pytorch.plugins.precision.double`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.precision import DoublePrecision

__all__ = ['DoublePrecision']
