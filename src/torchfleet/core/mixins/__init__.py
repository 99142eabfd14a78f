"""``lightning.pytorch.core.mixins`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.hparams import HyperparametersMixin

__all__ = ['HyperparametersMixin']
