"""Lightning's ``lightning.pytorch.strategies.launchers``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.launchers import Launcher, ProcessLauncher, ScriptLauncher

__all__ = ["Launcher", "ProcessLauncher", "ScriptLauncher"]
