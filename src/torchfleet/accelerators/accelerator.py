"""Lightning's ``lightning.pytorch.accelerators.accelerator``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.accelerators.base import Accelerator

__all__ = ["Accelerator"]
