"""Lightning's ``lightning.pytorch.callbacks.gradient_accumulation_scheduler``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler

__all__ = ["GradientAccumulationScheduler"]
