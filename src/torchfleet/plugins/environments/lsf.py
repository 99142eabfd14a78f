"""Lightning's ``lightning.fabric.plugins.environments.lsf``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.environments import LSFEnvironment

__all__ = ["LSFEnvironment"]
