"""``lightning.pytorch.strategies.launchers.subprocess_script`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.launchers.script import ScriptLauncher

__all__ = ['ScriptLauncher']
