"""Checkpoint storage: CheckpointIO and its implementations."""

from torchfleet.checkpoint.io import (
    AsyncCheckpointIO,
    CheckpointIO,
    TorchCheckpointIO,
    is_temp_file,
    load_with,
    save_with,
)

__all__ = ["CheckpointIO", "TorchCheckpointIO", "AsyncCheckpointIO", "save_with", "load_with", "is_temp_file"]
