"""``lightning.fabric.plugins.environments.lsf`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.environments import LSFEnvironment

__all__ = ['LSFEnvironment']
