"""Lightning's ``lightning.pytorch.plugins.io``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.checkpoint.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "TorchCheckpointIO"]
