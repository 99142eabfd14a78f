"""MPIEnvironment: processes started by mpirun/mpiexec (Open MPI, MPICH/Intel MPI via PMI, MVAPICH)."""

from __future__ import annotations

import os

from torchfleet.environments._common import (
    DEFAULT_PORT,
    LaunchedEnvironment,
    check_per_node,
    check_world_size,
    env_int,
)

_SIZE = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
_RANK = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK")
_LOCAL = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")
_LOCAL_SIZE = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE")


class MPIEnvironment(LaunchedEnvironment):
    """Ranks from the MPI launcher's variables (OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_*).

    MPI does not say where rank 0 listens: export MASTER_ADDR (default 127.0.0.1, right on one
    machine only) and MASTER_PORT (default 12910) to every rank, e.g. ``mpirun -x MASTER_ADDR=node0
    -x MASTER_PORT=29500``. The node rank assumes ranks are placed by node (the default
    ``--map-by slot``): global rank // local size.
    """

    WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_RANK_DEFAULT = _SIZE, _RANK, _LOCAL, 0

    @property
    def main_address(self) -> str:
        """MASTER_ADDR, default 127.0.0.1."""
        return os.environ.get("MASTER_ADDR") or "127.0.0.1"

    @property
    def main_port(self) -> int:
        """MASTER_PORT, default 12910."""
        return env_int("MASTER_PORT", default=DEFAULT_PORT)

    @staticmethod
    def detect() -> bool:
        """Whether an MPI launcher started this process (a world size and a rank are both set)."""
        return any(k in os.environ for k in _SIZE) and any(k in os.environ for k in _RANK)

    def _local_size(self) -> int | None:
        return env_int(*_LOCAL_SIZE, default=0) or None

    def node_rank(self) -> int:
        """global rank // processes per node (0 when the launcher does not say the processes per node)."""
        local_size = self._local_size()
        return self.global_rank() // local_size if local_size else 0

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise when the MPI world size (or processes per node) disagrees with devices x num_nodes (or devices)."""
        per_node = self._local_size()
        fix = f"run mpirun -np {num_devices * num_nodes} with {num_devices} processes per node."
        variable = next((k for k in _SIZE if os.environ.get(k)), None)
        check_world_size("mpirun", self.world_size(), num_devices, num_nodes, fix, variable, per_node)
        if per_node is not None:
            local_var = next(k for k in _LOCAL_SIZE if os.environ.get(k))
            check_per_node("mpirun", per_node, local_var, num_devices, fix)
