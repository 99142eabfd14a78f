"""``lightning.fabric.plugins.environments.cluster_environment`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.environments import ClusterEnvironment

__all__ = ['ClusterEnvironment']
