"""Lightning's ``lightning.pytorch.callbacks.lr_monitor``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.lr_monitor import LearningRateMonitor

__all__ = ["LearningRateMonitor"]
