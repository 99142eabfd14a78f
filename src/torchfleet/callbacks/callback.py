"""``lightning.pytorch.callbacks.callback`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.base import Callback

__all__ = ['Callback']
