"""``lightning.fabric.plugins.environments.mpi`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.environments import MPIEnvironment

__all__ = ['MPIEnvironment']
