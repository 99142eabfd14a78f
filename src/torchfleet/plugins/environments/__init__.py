"""``lightning.pytorch.plugins.environments`` names: the cluster environments torchfleet detects."""

from torchfleet.environments import (
    ClusterEnvironment,
    KubeflowEnvironment,
    LocalEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)

#: Lightning's name for the environment of processes started by the library itself
LightningEnvironment = LocalEnvironment

__all__ = ["ClusterEnvironment", "KubeflowEnvironment", "LightningEnvironment", "LocalEnvironment", "LSFEnvironment", "MPIEnvironment",
           "SLURMEnvironment", "TorchElasticEnvironment"]
