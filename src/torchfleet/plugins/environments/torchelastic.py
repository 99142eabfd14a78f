"""Lightning's ``lightning.fabric.plugins.environments.torchelastic``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.environments import TorchElasticEnvironment

__all__ = ["TorchElasticEnvironment"]
