"""TorchElasticEnvironment: processes started by torchrun (torch.distributed.run)."""

from __future__ import annotations

import os

from torchfleet.environments._common import check_world_size
from torchfleet.environments.base import ClusterEnvironment

_REQUIRED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class TorchElasticEnvironment(ClusterEnvironment):
    """torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, MASTER_ADDR and MASTER_PORT for every process."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ["MASTER_ADDR"]

    @property
    def main_port(self) -> int:
        return int(os.environ["MASTER_PORT"])

    @staticmethod
    def detect() -> bool:
        return "TORCHELASTIC_RUN_ID" in os.environ or all(k in os.environ for k in _REQUIRED)

    def world_size(self) -> int:
        return int(os.environ["WORLD_SIZE"])

    def set_world_size(self, size: int) -> None:
        pass  # torchrun decides

    def global_rank(self) -> int:
        return int(os.environ["RANK"])

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return int(os.environ["LOCAL_RANK"])

    def node_rank(self) -> int:
        return int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", 0)))

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        check_world_size(
            "torchrun", self.world_size(), num_devices, num_nodes,
            f"run torchrun --nnodes={num_nodes} --nproc-per-node={num_devices}, or set devices and num_nodes to "
            "what torchrun starts.",
        )
