"""Lightning's ``lightning.pytorch.plugins.precision.half``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.precision import HalfPrecision

__all__ = ["HalfPrecision"]
