"""``lightning.pytorch.plugins.io.async_plugin`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.checkpoint.io import AsyncCheckpointIO

__all__ = ['AsyncCheckpointIO']
