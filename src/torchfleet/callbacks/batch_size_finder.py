"""Lightning's ``lightning.pytorch.callbacks.batch_size_finder``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.batch_size_finder import BatchSizeFinder

__all__ = ["BatchSizeFinder"]
