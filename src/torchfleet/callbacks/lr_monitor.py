"""``lightning.pytorch.callbacks.lr_monitor`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.lr_monitor import LearningRateMonitor

__all__ = ['LearningRateMonitor']
