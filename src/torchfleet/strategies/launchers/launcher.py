"""``lightning.pytorch.strategies.launchers.launcher`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.launchers.base import Launcher

__all__ = ['Launcher']
