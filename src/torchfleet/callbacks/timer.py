"""Lightning's ``lightning.pytorch.callbacks.timer``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.timer import Interval, Timer

__all__ = ["Interval", "Timer"]
