"""Lightning's ``lightning.fabric.plugins.io.checkpoint_io``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.checkpoint.io import CheckpointIO

__all__ = ["CheckpointIO"]
