"""The ClusterEnvironment interface: who started the processes, and where rank 0 listens."""

from __future__ import annotations

from abc import ABC, abstractmethod


class ClusterEnvironment(ABC):
    """What the scheduler or launcher says about this process: world size, ranks, main address and port."""

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """True when every rank was started by something else (torchrun, srun, mpirun)."""

    @property
    @abstractmethod
    def main_address(self) -> str:
        """Address of the rank-0 node, for the TCP rendezvous."""

    @property
    @abstractmethod
    def main_port(self) -> int:
        """Port rank 0 listens on for the rendezvous."""

    @staticmethod
    @abstractmethod
    def detect() -> bool:
        """Whether the current process runs in this environment (read from environment variables)."""

    @abstractmethod
    def world_size(self) -> int:
        """Total number of processes."""

    @abstractmethod
    def set_world_size(self, size: int) -> None:
        """Record the world size when the environment does not dictate it."""

    @abstractmethod
    def global_rank(self) -> int:
        """Rank of this process among all processes."""

    @abstractmethod
    def set_global_rank(self, rank: int) -> None:
        """Record the global rank when the environment does not dictate it."""

    @abstractmethod
    def local_rank(self) -> int:
        """Rank of this process on its node."""

    @abstractmethod
    def node_rank(self) -> int:
        """Rank of this node among all nodes."""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise ConfigurationError when ``devices * num_nodes`` cannot match what the environment says."""

    def teardown(self) -> None:
        """Undo environment changes made for the run."""

    def on_preempted(self) -> str | None:
        """Called in global rank 0 once a preemption checkpoint is on disk, just before the run exits.

        An environment whose scheduler can run the job again asks for that here (SLURM: ``scontrol
        requeue``). Returns a sentence for the exit message, or None. Never raises.
        """
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
