"""Lightning's ``lightning.pytorch.callbacks.callback``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.base import Callback

__all__ = ["Callback"]
