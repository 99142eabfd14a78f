"""Lightning's ``lightning.pytorch.core.mixins``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.hparams import HyperparametersMixin

__all__ = ["HyperparametersMixin"]
