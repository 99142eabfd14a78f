"""``lightning.fabric.plugins.io.torch_io`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.checkpoint.io import TorchCheckpointIO

__all__ = ['TorchCheckpointIO']
