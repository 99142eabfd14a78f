"""Planning a run before it is launched: ``estimate_memory`` (memory per rank, traced on fake tensors)."""

from torchfleet.planner.estimate import MemoryEstimate, estimate_memory

__all__ = ["MemoryEstimate", "estimate_memory"]
