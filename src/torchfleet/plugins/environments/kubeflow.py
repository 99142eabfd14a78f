"""``lightning.fabric.plugins.environments.kubeflow`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.environments import KubeflowEnvironment

__all__ = ['KubeflowEnvironment']
