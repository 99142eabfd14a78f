"""Lightning's ``lightning.pytorch.plugins.io.torch_plugin``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.checkpoint.io import TorchCheckpointIO

__all__ = ["TorchCheckpointIO"]
