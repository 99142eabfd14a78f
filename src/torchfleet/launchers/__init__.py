"""Launchers: what starts the processes of a multi-process run (re-run the script, or spawn/fork)."""

from torchfleet.launchers.base import Launcher, ProcessFailedError
from torchfleet.launchers.processes import ProcessLauncher
from torchfleet.launchers.script import ScriptLauncher

__all__ = ["Launcher", "ProcessFailedError", "ScriptLauncher", "ProcessLauncher"]
