"""LocalEnvironment: processes started on this machine by torchfleet itself (or nothing else detected)."""

from __future__ import annotations

import logging
import os
import socket

from torchfleet.environments._common import env_int
from torchfleet.environments.base import ClusterEnvironment
from torchfleet.errors import ConfigurationError

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1"


def find_free_port(address: str = DEFAULT_ADDRESS) -> int:
    """A TCP port that is free on ``address`` right now (the OS picks it by binding port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class LocalEnvironment(ClusterEnvironment):
    """One machine (or several started by hand), ranks set by torchfleet: the default when nothing else is detected.

    - world size and global rank: set by the strategy (devices x num_nodes, and this
      process's place in it); before that, in a process started for us (LOCAL_RANK set),
      WORLD_SIZE / RANK when exported, else 1 / 0.
    - local rank: LOCAL_RANK (default 0); node rank: NODE_RANK (default 0).
    - main address: MASTER_ADDR (default 127.0.0.1).
    - main port: MASTER_PORT, else a free port chosen on first use and kept for the life of
      this object. The launcher exports it as MASTER_PORT to the processes it starts, so they
      all agree on it.

    Several machines without a scheduler: start the script on each one with the same
    MASTER_ADDR (node 0's address) and MASTER_PORT, and NODE_RANK=0..num_nodes-1.
    """

    def __init__(self) -> None:
        self._world_size: int | None = None
        self._global_rank: int | None = None
        self._port: int | None = None

    @property
    def creates_processes_externally(self) -> bool:
        """True when LOCAL_RANK is set: our script launcher re-ran this process, or the user started each rank."""
        return "LOCAL_RANK" in os.environ

    @property
    def main_address(self) -> str:
        """MASTER_ADDR, default 127.0.0.1."""
        return os.environ.get("MASTER_ADDR") or DEFAULT_ADDRESS

    @property
    def main_port(self) -> int:
        """MASTER_PORT, else a free port found once and returned by every later call."""
        if os.environ.get("MASTER_PORT"):
            return env_int("MASTER_PORT")
        if self._port is None:
            address = self.main_address
            try:
                self._port = find_free_port("127.0.0.1" if address == "localhost" else address)
            except OSError:
                # MASTER_ADDR names another machine (or an unresolvable name): any local free port will do
                self._port = find_free_port(DEFAULT_ADDRESS)
            log.debug("LocalEnvironment chose free port %d for the rendezvous", self._port)
        return self._port

    @staticmethod
    def detect() -> bool:
        """Always true: the fallback environment."""
        return True

    def world_size(self) -> int:
        """The size set by the strategy, else WORLD_SIZE in a process started for us, else 1."""
        if self._world_size is not None:
            return self._world_size
        # a stray WORLD_SIZE in the user's shell must not make the main process think it is one of many
        return env_int("WORLD_SIZE", default=1) if self.creates_processes_externally else 1

    def set_world_size(self, size: int) -> None:
        """Record the world size (devices x num_nodes)."""
        self._world_size = size

    def global_rank(self) -> int:
        """The rank set by the strategy, else RANK in a process started for us, else 0."""
        if self._global_rank is not None:
            return self._global_rank
        return env_int("RANK", default=0) if self.creates_processes_externally else 0

    def set_global_rank(self, rank: int) -> None:
        """Record this process's global rank."""
        self._global_rank = rank

    def local_rank(self) -> int:
        """LOCAL_RANK, default 0."""
        return env_int("LOCAL_RANK", default=0)

    def node_rank(self) -> int:
        """NODE_RANK, default 0."""
        return env_int("NODE_RANK", default=0)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise when several nodes are asked for without the variables that let them find each other."""
        if num_nodes > 1:
            missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
            if missing:
                raise ConfigurationError(
                    f"num_nodes={num_nodes} without a cluster scheduler needs {' and '.join(missing)} in the "
                    "environment: start the script on every node with the same MASTER_ADDR (node 0's address) "
                    f"and MASTER_PORT, and NODE_RANK=0..{num_nodes - 1}; or launch with torchrun or srun, or use "
                    "num_nodes=1."
                )
        node = self.node_rank()
        if not 0 <= node < num_nodes:
            raise ConfigurationError(
                f"NODE_RANK={node} is outside the {num_nodes} node(s) the Trainer is configured for "
                f"(num_nodes={num_nodes}): give each node a NODE_RANK from 0 to {num_nodes - 1}, or raise num_nodes."
            )
        local = self.local_rank()
        if not 0 <= local < num_devices:
            raise ConfigurationError(
                f"LOCAL_RANK={local} is outside the {num_devices} processes per node the Trainer is configured "
                f"for (devices={num_devices}): local ranks run from 0 to {num_devices - 1}."
            )
