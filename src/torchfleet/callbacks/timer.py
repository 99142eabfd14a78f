"""``lightning.pytorch.callbacks.timer`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.timer import Interval, Timer

__all__ = ["Interval", "Timer"]
