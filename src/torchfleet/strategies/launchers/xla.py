"""Lightning's ``lightning.pytorch.strategies.launchers.xla``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.launchers.xla import XLALauncher

__all__ = ["XLALauncher"]
