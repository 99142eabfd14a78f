"""Lightning's ``lightning.pytorch.callbacks.lr_finder``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.lr_finder import LearningRateFinder

__all__ = ["LearningRateFinder"]
