"""LSFEnvironment: processes started by jsrun on IBM Spectrum LSF (e.g. Summit-class machines)."""

from __future__ import annotations

import os

from torchfleet.environments._common import check_world_size, env_int
from torchfleet.environments.base import ClusterEnvironment


class LSFEnvironment(ClusterEnvironment):
    """Ranks from JSM_NAMESPACE_*; hosts from LSB_DJOB_RANKFILE (or LSB_MCPU_HOSTS)."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @staticmethod
    def _hosts() -> list[str]:
        rankfile = os.environ.get("LSB_DJOB_RANKFILE")
        if rankfile and os.path.exists(rankfile):
            with open(rankfile) as f:
                hosts = [line.strip() for line in f if line.strip()]
            # the first line is the launch (batch) node, which runs no rank
            hosts = hosts[1:] if len(hosts) > 1 else hosts
            return list(dict.fromkeys(hosts))
        parts = os.environ.get("LSB_MCPU_HOSTS", "").split()
        hosts = parts[0::2]
        return hosts[1:] if len(hosts) > 1 else hosts

    @property
    def main_address(self) -> str:
        if "MASTER_ADDR" in os.environ:
            return os.environ["MASTER_ADDR"]
        hosts = self._hosts()
        return hosts[0] if hosts else "127.0.0.1"

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return int(os.environ["MASTER_PORT"])
        job = os.environ.get("LSB_JOBID", "0")
        return 10000 + int(job[-4:]) if job[-4:].isdigit() else 12910

    @staticmethod
    def detect() -> bool:
        return all(k in os.environ for k in ("LSB_JOBID", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK"))

    def world_size(self) -> int:
        return env_int("JSM_NAMESPACE_SIZE")

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        return env_int("JSM_NAMESPACE_RANK")

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return env_int("JSM_NAMESPACE_LOCAL_RANK")

    def node_rank(self) -> int:
        hosts = self._hosts()
        host = os.environ.get("HOSTNAME", "")
        return hosts.index(host) if host in hosts else 0

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        check_world_size(
            "jsrun (LSF)", self.world_size(), num_devices, num_nodes,
            f"launch {num_devices} resource sets per host on {num_nodes} hosts, or set devices/num_nodes to match.",
        )
