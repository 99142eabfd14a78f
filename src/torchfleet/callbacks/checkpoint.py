"""``lightning.pytorch.callbacks.checkpoint`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.base import Checkpoint

__all__ = ["Checkpoint"]
