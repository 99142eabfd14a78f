"""Checkpoint storage: CheckpointIO and its implementations."""

from torchfleet.checkpoint.io import (
    AsyncCheckpointIO,
    CheckpointIO,
    TorchCheckpointIO,
    is_temp_file,
)

__all__ = ["CheckpointIO", "TorchCheckpointIO", "AsyncCheckpointIO", "is_temp_file"]
