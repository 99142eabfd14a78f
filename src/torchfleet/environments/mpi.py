"""MPIEnvironment: processes started by mpirun/mpiexec (Open MPI, MPICH/PMI, MVAPICH)."""

from __future__ import annotations

import os

from torchfleet.environments._common import check_world_size, env_int
from torchfleet.environments.base import ClusterEnvironment

_SIZE = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
_RANK = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK")
_LOCAL = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")
_LOCAL_SIZE = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE")


class MPIEnvironment(ClusterEnvironment):
    """Ranks from the MPI launcher's variables. MPI does not say where rank 0 listens: export MASTER_ADDR
    (default 127.0.0.1, right for one machine) and MASTER_PORT (default 12910) to every rank."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", 12910))

    @staticmethod
    def detect() -> bool:
        return any(k in os.environ for k in _SIZE) and any(k in os.environ for k in _RANK)

    def world_size(self) -> int:
        return env_int(*_SIZE)

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        return env_int(*_RANK)

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return env_int(*_LOCAL, default=0)

    def node_rank(self) -> int:
        local_size = env_int(*_LOCAL_SIZE, default=0)
        return self.global_rank() // local_size if local_size else 0

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        check_world_size(
            "mpirun", self.world_size(), num_devices, num_nodes,
            f"run mpirun -np {num_devices * num_nodes} with {num_devices} per node, or set devices/num_nodes to match.",
        )
