"""Lightning's ``lightning.pytorch.plugins.precision.precision``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.precision import Precision

__all__ = ["Precision"]
