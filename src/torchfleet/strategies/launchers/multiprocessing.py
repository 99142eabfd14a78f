"""Lightning's ``lightning.pytorch.strategies.launchers.multiprocessing``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.launchers.processes import ProcessLauncher

__all__ = ["ProcessLauncher"]
