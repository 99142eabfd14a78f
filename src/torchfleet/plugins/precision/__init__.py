"""Lightning's ``lightning.pytorch.plugins.precision``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision, TruePrecision

__all__ = ["DoublePrecision", "HalfPrecision", "MixedPrecision", "Precision", "TruePrecision"]
