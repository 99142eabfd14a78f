"""``lightning.fabric.plugins.environments.slurm`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.environments import SLURMEnvironment

__all__ = ['SLURMEnvironment']
