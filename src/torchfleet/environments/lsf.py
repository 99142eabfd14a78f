"""LSFEnvironment: processes started by jsrun on IBM Spectrum LSF (e.g. Summit-class machines)."""

from __future__ import annotations

import os
import socket

from torchfleet.environments._common import (
    LaunchedEnvironment,
    address_or_first_host,
    check_world_size,
    job_port,
)
from torchfleet.errors import ConfigurationError

_REQUIRED = ("LSB_JOBID", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_RANK")
_HOST_SOURCES = ("LSB_DJOB_RANKFILE", "LSB_MCPU_HOSTS")


def lsf_hosts() -> list[str]:
    """The job's compute hosts in order, without the launch node, from LSB_DJOB_RANKFILE or LSB_MCPU_HOSTS."""
    rankfile = os.environ.get("LSB_DJOB_RANKFILE")
    if rankfile and os.path.isfile(rankfile):
        with open(rankfile) as f:
            lines = [line.strip() for line in f if line.strip()]
    else:
        # "launch 1 h1 42 h2 42": host, slot count, host, slot count, ...
        lines = os.environ.get("LSB_MCPU_HOSTS", "").split()[0::2]
    # the first entry is the launch (batch) node, which runs no rank
    hosts = lines[1:] if len(lines) > 1 else lines
    return list(dict.fromkeys(hosts))


def _check_hosts_and_port() -> None:
    """Raise, as the environment is created, when the job's hosts or its port cannot be known (as Lightning does)."""
    rankfile = os.environ.get("LSB_DJOB_RANKFILE")
    if not lsf_hosts():
        if rankfile is None:
            problem = "Did not find the environment variable `LSB_DJOB_RANKFILE`"
        elif not rankfile:
            problem = "The environment variable `LSB_DJOB_RANKFILE` is empty"
        else:
            problem = f"LSB_DJOB_RANKFILE={rankfile!r} names no readable file of host names"
        raise ConfigurationError(
            f"{problem}, and LSB_MCPU_HOSTS does not list the hosts either, so LSFEnvironment cannot tell where rank "
            "0 runs. Accepted: a process started by jsrun inside an LSF job (LSF sets both variables), or "
            "LSB_DJOB_RANKFILE set to a file with one host per line, the launch node first."
        )
    if not os.environ.get("MASTER_PORT") and not os.environ.get("LSB_JOBID"):
        raise ConfigurationError(
            "Could not find job id in environment variable LSB_JOBID, which LSFEnvironment turns into the main port "
            "(10000 + its last three digits). Accepted: a process started inside an LSF job, or MASTER_PORT set to "
            "the port rank 0 listens on."
        )


class LSFEnvironment(LaunchedEnvironment):
    """Ranks from JSM_NAMESPACE_SIZE/RANK/LOCAL_RANK (set by jsrun); hosts from LSB_DJOB_RANKFILE or LSB_MCPU_HOSTS.

    Detected when LSB_JOBID, JSM_NAMESPACE_SIZE, JSM_NAMESPACE_LOCAL_RANK and a host list are set.
    Rank 0 runs on the first compute host; the main port is MASTER_PORT, else 10000 plus the last
    three digits of LSB_JOBID (Lightning's rule), which every rank computes alike. Creating one
    outside such a job raises at once: no host list, or neither LSB_JOBID nor MASTER_PORT.
    """

    WORLD_SIZE, RANK, LOCAL_RANK = ("JSM_NAMESPACE_SIZE",), ("JSM_NAMESPACE_RANK",), ("JSM_NAMESPACE_LOCAL_RANK",)

    def __init__(self) -> None:
        """Check that the job's hosts and main port can be known (the errors name the variables)."""
        _check_hosts_and_port()

    @property
    def main_address(self) -> str:
        """MASTER_ADDR, else the first compute host of the job."""
        return address_or_first_host(lsf_hosts)

    @property
    def main_port(self) -> int:
        """MASTER_PORT, else 10000 + the last three digits of LSB_JOBID."""
        return job_port("LSB_JOBID", 10000, 3)

    @staticmethod
    def detect() -> bool:
        """Whether jsrun under LSF started this process (the job id, jsrun's size and local rank, a host list)."""
        return all(k in os.environ for k in _REQUIRED) and any(k in os.environ for k in _HOST_SOURCES)

    def node_rank(self) -> int:
        """The position of this host (HOSTNAME, else socket.gethostname()) among the job's compute hosts."""
        hosts = lsf_hosts()
        host = os.environ.get("HOSTNAME") or socket.gethostname()
        for candidate in (host, host.split(".")[0]):
            if candidate in hosts:
                return hosts.index(candidate)
        return 0

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise when JSM_NAMESPACE_SIZE disagrees with devices x num_nodes."""
        hosts = lsf_hosts()
        world = self.world_size()
        per_node = world // len(hosts) if hosts and world % len(hosts) == 0 else None
        check_world_size(
            "jsrun (LSF)", world, num_devices, num_nodes,
            f"start {num_devices} ranks on each of {num_nodes} hosts with jsrun.", "JSM_NAMESPACE_SIZE", per_node,
        )
