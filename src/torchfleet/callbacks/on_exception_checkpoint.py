"""Lightning's ``lightning.pytorch.callbacks.on_exception_checkpoint``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.on_exception_checkpoint import OnExceptionCheckpoint

__all__ = ["OnExceptionCheckpoint"]
