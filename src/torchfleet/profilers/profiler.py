"""Lightning's ``lightning.pytorch.profilers.profiler``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.profilers.base import Profiler

__all__ = ["Profiler"]
