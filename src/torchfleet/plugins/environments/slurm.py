"""Lightning's ``lightning.fabric.plugins.environments.slurm``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.environments import SLURMEnvironment

__all__ = ["SLURMEnvironment"]
