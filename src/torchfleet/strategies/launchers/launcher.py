"""Lightning's ``lightning.pytorch.strategies.launchers.launcher``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.launchers.base import Launcher

__all__ = ["Launcher"]
