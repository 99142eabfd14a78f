"""``lightning.pytorch.plugins.precision`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision, TruePrecision

__all__ = ['DoublePrecision', 'HalfPrecision', 'MixedPrecision', 'Precision', 'TruePrecision']
