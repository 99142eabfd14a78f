"""``lightning.fabric.plugins.io.checkpoint_io`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.checkpoint.io import CheckpointIO

__all__ = ['CheckpointIO']
