"""Lightning's ``lightning.fabric.plugins.environments.cluster_environment``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.environments import ClusterEnvironment

__all__ = ["ClusterEnvironment"]
