"""LocalEnvironment: processes started on this machine by torchfleet itself (or nothing else detected)."""

from __future__ import annotations

import os
import socket

from torchfleet.environments.base import ClusterEnvironment


def find_free_port(address: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``address`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class LocalEnvironment(ClusterEnvironment):
    """One machine (or several started by hand with NODE_RANK/MASTER_ADDR/MASTER_PORT), ranks set by torchfleet.

    The main port comes from MASTER_PORT, else a free port is chosen once for the life of this
    object; the launcher exports it to the processes it starts, so they all agree.
    """

    def __init__(self) -> None:
        self._world_size = 1
        self._global_rank = 0
        self._port: int | None = None

    @property
    def creates_processes_externally(self) -> bool:
        # LOCAL_RANK in the environment: this process was started for us (our launcher's child, or by hand)
        return "LOCAL_RANK" in os.environ

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return int(os.environ["MASTER_PORT"])
        if self._port is None:
            self._port = find_free_port(self.main_address if self.main_address != "localhost" else "127.0.0.1")
        return self._port

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ else self._world_size

    def set_world_size(self, size: int) -> None:
        self._world_size = size

    def global_rank(self) -> int:
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", 0))

    def node_rank(self) -> int:
        return int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", 0)))
