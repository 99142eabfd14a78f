"""The batch size finder as Lightning's ``tuner.batch_size_scaling`` names it (the search lives with its callback)."""

from __future__ import annotations

from torchfleet.trainer.callbacks.batch_size_finder import is_oom_error, scale_batch_size

_scale_batch_size = scale_batch_size

__all__ = ["scale_batch_size", "is_oom_error"]
