"""``lightning.pytorch.plugins.precision.amp`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.precision import MixedPrecision

__all__ = ['MixedPrecision']
