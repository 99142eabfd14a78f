"""Lightning's ``lightning.pytorch.plugins.precision.amp``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.precision import MixedPrecision

__all__ = ["MixedPrecision"]
