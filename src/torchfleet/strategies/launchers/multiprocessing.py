"""``lightning.pytorch.strategies.launchers.multiprocessing`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.launchers.processes import ProcessLauncher

__all__ = ['ProcessLauncher']
