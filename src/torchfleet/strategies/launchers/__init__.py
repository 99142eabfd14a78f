"""``lightning.pytorch.strategies.launchers`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.launchers import Launcher, ProcessLauncher, ScriptLauncher

__all__ = ['Launcher', 'ProcessLauncher', 'ScriptLauncher']
