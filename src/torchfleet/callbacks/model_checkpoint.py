"""Lightning's ``lightning.pytorch.callbacks.model_checkpoint``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.checkpoint import ModelCheckpoint

__all__ = ["ModelCheckpoint"]
