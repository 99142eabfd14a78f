"""Helpers shared by the environments that read a world size from the scheduler."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable

from torchfleet.environments.base import ClusterEnvironment
from torchfleet.errors import ConfigurationError, MissingEnvironmentVariableError

log = logging.getLogger(__name__)


def env_str(*names: str) -> str:
    """The first of ``names`` set (non-empty) in the environment; MissingEnvironmentVariableError when none is."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    raise MissingEnvironmentVariableError(
        f"None of the environment variables {', '.join(names)} is set, but this process was detected as "
        "started by a launcher that sets them. Start it through that launcher, or unset its other variables."
    )


def env_int(*names: str, default: int | None = None) -> int:
    """The first of ``names`` set (non-empty) in the environment, as an int; ``default`` when none is."""
    if default is not None and not any(os.environ.get(name) for name in names):
        return default
    value = env_str(*names)
    name = next(n for n in names if os.environ.get(n))
    try:
        return int(value)
    except ValueError:
        raise ConfigurationError(
            f"The environment variable {name}={value!r} should be an integer; the launcher or the job "
            "script set it wrongly."
        ) from None


def suggest_layout(world_size: int, per_node: int | None) -> str:
    """'devices=a num_nodes=b' matching ``world_size`` processes, ``per_node`` per node when known."""
    if per_node and per_node > 0 and world_size % per_node == 0:
        return f"devices={per_node} and num_nodes={world_size // per_node}"
    return f"devices and num_nodes with devices x num_nodes = {world_size}"


def check_world_size(
    launcher: str,
    world_size: int,
    num_devices: int,
    num_nodes: int,
    fix: str,
    variable: str | None = None,
    per_node: int | None = None,
) -> None:
    """Raise when the launcher started a different number of processes than devices x num_nodes.

    ``variable`` names the environment variable the world size came from; ``per_node`` is the
    launcher's processes per node when known, to suggest the matching Trainer arguments.
    """
    expected = num_devices * num_nodes
    if world_size == expected:
        return
    source = f" ({variable}={world_size})" if variable else ""
    # "the product (a * b) does not match the world size (n)" is Lightning's wording, kept for ported log filters
    raise ConfigurationError(
        f"{launcher} started {world_size} processes{source}, but the Trainer is configured for "
        f"devices={num_devices} x num_nodes={num_nodes} = {expected}: the product ({num_devices} * {num_nodes}) "
        f"does not match the world size ({world_size}). Make the two agree: set "
        f"{suggest_layout(world_size, per_node)}, or {fix}"
    )


def check_per_node(launcher: str, per_node: int, variable: str, num_devices: int, fix: str) -> None:
    """Raise when the launcher's processes per node differ from ``devices``."""
    if per_node != num_devices:
        raise ConfigurationError(
            f"{launcher} started {per_node} processes per node ({variable}={per_node}), but the Trainer is "
            f"configured for devices={num_devices} per node. Set devices={per_node}, or {fix}"
        )


#: the port every rank computes alike when neither MASTER_PORT nor a job id says one
DEFAULT_PORT = 12910


def job_port(job_id_variable: str, base: int, digits: int) -> int:
    """MASTER_PORT, else ``base`` + the last ``digits`` digits of the scheduler's job id, else DEFAULT_PORT.

    Every task computes the same port without talking to the others, and two jobs sharing a node
    rarely collide. The bases and digit counts are Lightning's (SLURM: 15000 + 4 digits, LSF: 10000 +
    3), so a job that mixes the two, or a firewall opened for Lightning's ports, keeps working.
    """
    if os.environ.get("MASTER_PORT"):
        return env_int("MASTER_PORT")
    found = re.sub(r"\D", "", os.environ.get(job_id_variable, ""))
    return base + int(found[-digits:]) if found else DEFAULT_PORT


def address_or_first_host(hosts: Callable[[], list[str]]) -> str:
    """MASTER_ADDR when set, else the first of the job's ``hosts()`` (where rank 0 runs), else 127.0.0.1."""
    if os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    found = hosts()
    return found[0] if found else "127.0.0.1"


class LaunchedEnvironment(ClusterEnvironment):
    """An environment whose launcher started every rank and says who is who in environment variables.

    Subclasses name the variables (each a tuple, read first-set-wins): ``WORLD_SIZE``, ``RANK`` and
    ``LOCAL_RANK``; ``LOCAL_RANK_DEFAULT`` is used when no local-rank variable is set (None: one must
    be). The launcher decides the ranks, so the setters do nothing.
    """

    WORLD_SIZE: tuple[str, ...] = ()
    RANK: tuple[str, ...] = ()
    LOCAL_RANK: tuple[str, ...] = ()
    LOCAL_RANK_DEFAULT: int | None = None

    @property
    def creates_processes_externally(self) -> bool:
        """Always: the launcher started every rank."""
        return True

    def world_size(self) -> int:
        """The first of ``WORLD_SIZE`` that is set."""
        return env_int(*self.WORLD_SIZE)

    def set_world_size(self, size: int) -> None:
        """Ignored: the launcher decides (a debug line says so)."""
        log.debug("%s.set_world_size was called, but setting world size is not allowed: the launcher decides. "
                  "Ignored.", type(self).__name__)

    def global_rank(self) -> int:
        """The first of ``RANK`` that is set."""
        return env_int(*self.RANK)

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the launcher decides (a debug line says so)."""
        log.debug("%s.set_global_rank was called, but setting global rank is not allowed: the launcher decides. "
                  "Ignored.", type(self).__name__)

    def local_rank(self) -> int:
        """The first of ``LOCAL_RANK`` that is set (``LOCAL_RANK_DEFAULT`` when none is and one is given)."""
        return env_int(*self.LOCAL_RANK, default=self.LOCAL_RANK_DEFAULT)
