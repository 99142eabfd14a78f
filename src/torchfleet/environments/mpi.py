"""MPIEnvironment: processes started by mpirun/mpiexec (Open MPI, MPICH/Intel MPI via PMI, MVAPICH)."""

from __future__ import annotations

import importlib.util
import os
import socket
from typing import Any

from torchfleet.environments._common import (
    DEFAULT_PORT,
    LaunchedEnvironment,
    check_per_node,
    check_world_size,
    env_int,
)
from torchfleet.environments.local import find_free_port

_SIZE = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
_RANK = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK")
_LOCAL = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")
_LOCAL_SIZE = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE")

#: whether mpi4py is installed (Lightning's flag name, so code and tests that set it port unchanged)
_MPI4PY_AVAILABLE = importlib.util.find_spec("mpi4py") is not None


def _launcher_variables_set() -> bool:
    """Whether an MPI launcher we know exported a world size and a rank."""
    return any(k in os.environ for k in _SIZE) and any(k in os.environ for k in _RANK)


def _comm_world() -> Any | None:
    """mpi4py's COMM_WORLD, or None when mpi4py is missing or cannot load its MPI library."""
    if not _MPI4PY_AVAILABLE:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD


class MPIEnvironment(LaunchedEnvironment):
    """Ranks from MPI itself (with mpi4py, as Lightning) or from the launcher's variables (without it).

    With mpi4py installed, COMM_WORLD gives the world size and rank; the node rank is this host's
    place among the sorted host names of all ranks, and the local rank its rank among the ranks on
    its host. Without mpi4py, the variables of Open MPI (OMPI_COMM_WORLD_*), MPICH/Intel MPI (PMI_*)
    and MVAPICH (MV2_COMM_WORLD_*) are read; the node rank then assumes ranks placed by node (the
    default ``--map-by slot``): global rank // local size.

    MASTER_ADDR and MASTER_PORT win when exported to every rank (``mpirun -x MASTER_ADDR=node0 -x
    MASTER_PORT=29500``). Otherwise, with mpi4py, rank 0's host name and a port free there are
    broadcast; without it, 127.0.0.1 (right on one machine only) and 12910.
    """

    WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_RANK_DEFAULT = _SIZE, _RANK, _LOCAL, 0

    def __init__(self) -> None:
        """Raise ModuleNotFoundError when neither mpi4py nor an MPI launcher's variables are there."""
        self._comm_world = _comm_world()
        self._comm_local: Any | None = None
        self._node_rank: int | None = None
        self._main_address: str | None = None
        self._main_port: int | None = None
        if self._comm_world is None and not _launcher_variables_set():
            raise ModuleNotFoundError(
                "MPIEnvironment needs mpi4py (pip install mpi4py), or a process started by mpirun/mpiexec, whose "
                "variables (OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_*) it reads without mpi4py; neither is here. "
                "Start the script with mpirun, install mpi4py, or leave the environment out to run locally."
            )

    @property
    def main_address(self) -> str:
        """MASTER_ADDR; else rank 0's host name (mpi4py); else 127.0.0.1."""
        if os.environ.get("MASTER_ADDR"):
            return os.environ["MASTER_ADDR"]
        if self._comm_world is None:
            return "127.0.0.1"
        if self._main_address is None:
            self._main_address = self._comm_world.bcast(socket.gethostname(), root=0)
        return self._main_address

    @property
    def main_port(self) -> int:
        """MASTER_PORT; else a port free on rank 0's host, broadcast (mpi4py); else 12910."""
        if os.environ.get("MASTER_PORT") or self._comm_world is None:
            return env_int("MASTER_PORT", default=DEFAULT_PORT)
        if self._main_port is None:
            # only rank 0 looks for a port: it is the one that listens
            mine = find_free_port("") if self._comm_world.Get_rank() == 0 else None
            self._main_port = self._comm_world.bcast(mine, root=0)
        return self._main_port

    @staticmethod
    def detect() -> bool:
        """Whether an MPI launcher started this process: its variables, else (mpi4py) a COMM_WORLD of 2 or more."""
        if _launcher_variables_set():
            return True
        comm = _comm_world()
        return comm is not None and comm.Get_size() > 1

    def world_size(self) -> int:
        """COMM_WORLD's size (mpi4py), else the launcher's variable."""
        return self._comm_world.Get_size() if self._comm_world is not None else super().world_size()

    def global_rank(self) -> int:
        """COMM_WORLD's rank (mpi4py), else the launcher's variable."""
        return self._comm_world.Get_rank() if self._comm_world is not None else super().global_rank()

    def local_rank(self) -> int:
        """The rank among the ranks on this host (mpi4py), else the launcher's variable (default 0)."""
        if self._comm_world is None:
            return super().local_rank()
        if self._comm_local is None:
            self._find_node()
        return self._comm_local.Get_rank()

    def _local_size(self) -> int | None:
        return env_int(*_LOCAL_SIZE, default=0) or None

    def node_rank(self) -> int:
        """This host's place among the ranks' sorted host names (mpi4py), else global rank // processes per node."""
        if self._comm_world is not None:
            if self._node_rank is None:
                self._find_node()
            return self._node_rank
        local_size = self._local_size()
        return self.global_rank() // local_size if local_size else 0

    def _find_node(self) -> None:
        """A collective over COMM_WORLD: rank 0 collects every host name, each rank finds its host among them."""
        host = socket.gethostname()
        collected = self._comm_world.gather(host, root=0)  # None on the other ranks
        hosts = self._comm_world.bcast(sorted(set(collected)) if collected is not None else None, root=0)
        self._node_rank = hosts.index(host)
        self._comm_local = self._comm_world.Split(color=self._node_rank)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise when the MPI world size (or processes per node) disagrees with devices x num_nodes (or devices)."""
        fix = f"run mpirun -np {num_devices * num_nodes} with {num_devices} processes per node."
        if self._comm_world is not None:
            # the processes per node would need a collective here; the world size is known locally
            check_world_size("mpirun", self.world_size(), num_devices, num_nodes, fix, "MPI.COMM_WORLD size")
            return
        per_node = self._local_size()
        variable = next((k for k in _SIZE if os.environ.get(k)), None)
        check_world_size("mpirun", self.world_size(), num_devices, num_nodes, fix, variable, per_node)
        if per_node is not None:
            local_var = next(k for k in _LOCAL_SIZE if os.environ.get(k))
            check_per_node("mpirun", per_node, local_var, num_devices, fix)
