"""Lightning's ``lightning.pytorch.plugins.io.checkpoint_plugin``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.checkpoint.io import CheckpointIO

__all__ = ["CheckpointIO"]
