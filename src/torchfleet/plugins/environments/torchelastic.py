"""``lightning.fabric.plugins.environments.torchelastic`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.environments import TorchElasticEnvironment

__all__ = ['TorchElasticEnvironment']
