"""Lightning's ``lightning.pytorch.plugins.io.async_plugin``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.checkpoint.io import AsyncCheckpointIO

__all__ = ["AsyncCheckpointIO"]
