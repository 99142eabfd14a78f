"""Lightning's ``lightning.pytorch.plugins`` names for what torchfleet has: precisions, checkpoint IO, cluster
environments (``from torchfleet.plugins.environments import SLURMEnvironment``). Pass them as ``Trainer(plugins=[...])``
or ``Fleet(plugins=[...])``."""

from torchfleet.checkpoint.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
from torchfleet.environments import ClusterEnvironment
from torchfleet.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision, TruePrecision

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "TorchCheckpointIO", "ClusterEnvironment", "Precision", "DoublePrecision",
           "HalfPrecision", "MixedPrecision", "TruePrecision"]
