"""Lightning's ``lightning.pytorch.callbacks.checkpoint``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.base import Checkpoint

__all__ = ["Checkpoint"]
