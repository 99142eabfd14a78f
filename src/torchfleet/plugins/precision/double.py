"""Lightning's ``lightning.pytorch.plugins.precision.double``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.precision import DoublePrecision

__all__ = ["DoublePrecision"]
