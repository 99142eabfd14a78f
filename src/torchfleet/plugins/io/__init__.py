"""``lightning.pytorch.plugins.io`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.checkpoint.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO

__all__ = ['AsyncCheckpointIO', 'CheckpointIO', 'TorchCheckpointIO']
