"""``lightning.pytorch.strategies.launchers.xla`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.launchers.xla import XLALauncher

__all__ = ['XLALauncher']
