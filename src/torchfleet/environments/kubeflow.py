"""KubeflowEnvironment: a PyTorchJob on Kubernetes, one process per pod."""

from __future__ import annotations

import os

from torchfleet.environments._common import check_world_size
from torchfleet.environments.torchelastic import TorchElasticEnvironment


class KubeflowEnvironment(TorchElasticEnvironment):
    """The Kubeflow training operator sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK (one rank per pod).

    Those variables are read as torchrun's are; what differs is that each pod runs one process,
    so its local rank is 0 and its node rank is its global rank.
    """

    @staticmethod
    def detect() -> bool:
        needed = ("KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
        # LOCAL_RANK/GROUP_RANK would mean torchrun inside the pod: that is torchelastic, not this
        return all(k in os.environ for k in needed) and not any(k in os.environ for k in ("LOCAL_RANK", "GROUP_RANK"))

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return self.global_rank()

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        check_world_size(
            "The Kubeflow PyTorchJob", self.world_size(), num_devices, num_nodes,
            f"one process per pod means devices=1 and num_nodes={self.world_size()}.",
        )
