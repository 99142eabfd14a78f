"""``lightning.pytorch.core.optimizer`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.optim_wrapper import OptimizerWrapper

__all__ = ['OptimizerWrapper']
