"""Lightning's ``lightning.fabric.plugins.environments.kubeflow``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.environments import KubeflowEnvironment

__all__ = ["KubeflowEnvironment"]
