"""``lightning.pytorch.callbacks.model_checkpoint`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.checkpoint import ModelCheckpoint

__all__ = ['ModelCheckpoint']
