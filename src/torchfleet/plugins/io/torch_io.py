"""Lightning's ``lightning.fabric.plugins.io.torch_io``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.checkpoint.io import TorchCheckpointIO

__all__ = ["TorchCheckpointIO"]
