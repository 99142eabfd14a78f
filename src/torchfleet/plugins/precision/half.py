"""``lightning.pytorch.plugins.precision.half`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.precision import HalfPrecision

__all__ = ['HalfPrecision']
