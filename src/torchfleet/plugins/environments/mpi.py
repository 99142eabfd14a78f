"""Lightning's ``lightning.fabric.plugins.environments.mpi``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.environments import MPIEnvironment

__all__ = ["MPIEnvironment"]
