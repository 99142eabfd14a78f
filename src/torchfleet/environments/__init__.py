"""Cluster environments: who started the processes, their ranks, and where rank 0 listens."""

from __future__ import annotations

from torchfleet.environments.base import ClusterEnvironment
from torchfleet.environments.kubeflow import KubeflowEnvironment
from torchfleet.environments.local import LocalEnvironment, find_free_port
from torchfleet.environments.lsf import LSFEnvironment
from torchfleet.environments.mpi import MPIEnvironment
from torchfleet.environments.slurm import SLURMEnvironment, expand_nodelist
from torchfleet.environments.torchelastic import TorchElasticEnvironment

#: detection order: the first environment whose detect() is true wins
DETECTION_ORDER: tuple[type[ClusterEnvironment], ...] = (
    TorchElasticEnvironment,
    SLURMEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    KubeflowEnvironment,
)


def detect_environment() -> ClusterEnvironment:
    """The environment this process runs in: torchelastic > slurm > lsf > mpi > kubeflow > local."""
    for env in DETECTION_ORDER:
        if env.detect():
            return env()
    return LocalEnvironment()


__all__ = [
    "ClusterEnvironment",
    "LocalEnvironment",
    "TorchElasticEnvironment",
    "SLURMEnvironment",
    "LSFEnvironment",
    "MPIEnvironment",
    "KubeflowEnvironment",
    "detect_environment",
    "find_free_port",
    "expand_nodelist",
]
