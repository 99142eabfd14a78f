"""KubeflowEnvironment: a PyTorchJob on Kubernetes, one process per pod."""

from __future__ import annotations

import os

from torchfleet.environments._common import check_world_size, env_int, env_str
from torchfleet.environments.torchelastic import TorchElasticEnvironment


class KubeflowEnvironment(TorchElasticEnvironment):
    """The Kubeflow training operator sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK (one rank per pod).

    Those variables are read as torchrun's are; what differs is that each pod runs one process,
    so its local rank is 0 and its node rank is its global rank. Detected inside Kubernetes
    (KUBERNETES_PORT) when those four are set and LOCAL_RANK/GROUP_RANK are not: with them, a
    torchrun inside the pod started the processes and TorchElasticEnvironment applies.
    """

    @staticmethod
    def detect() -> bool:
        """Whether this process is one pod of a PyTorchJob."""
        needed = ("KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
        return all(k in os.environ for k in needed) and not any(k in os.environ for k in ("LOCAL_RANK", "GROUP_RANK"))

    @property
    def main_address(self) -> str:
        """MASTER_ADDR, which the PyTorchJob sets (a KeyError when it is missing)."""
        return env_str("MASTER_ADDR")

    @property
    def main_port(self) -> int:
        """MASTER_PORT, which the PyTorchJob sets (a KeyError when it is missing)."""
        return env_int("MASTER_PORT")

    def local_rank(self) -> int:
        """0: one process per pod."""
        return 0

    def node_rank(self) -> int:
        """The global rank: each pod is a node."""
        return self.global_rank()

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise when the job's WORLD_SIZE disagrees with devices x num_nodes."""
        check_world_size(
            "The Kubeflow PyTorchJob", self.world_size(), num_devices, num_nodes,
            f"give the PyTorchJob {num_devices * num_nodes} replicas (one process per pod).", "WORLD_SIZE", 1,
        )
