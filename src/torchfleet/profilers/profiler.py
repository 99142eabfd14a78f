"""``lightning.pytorch.profilers.profiler`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.profilers.base import Profiler

__all__ = ['Profiler']
