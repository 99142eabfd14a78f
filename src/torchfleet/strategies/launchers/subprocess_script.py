"""Lightning's ``lightning.pytorch.strategies.launchers.subprocess_script``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.launchers.script import ScriptLauncher

__all__ = ["ScriptLauncher"]
