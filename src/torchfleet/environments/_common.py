"""Helpers shared by the environments that read a world size from the scheduler."""

from __future__ import annotations

import os

from torchfleet.errors import ConfigurationError


def env_int(*names: str, default: int | None = None) -> int:
    """The first of ``names`` set (non-empty) in the environment, as an int; ``default`` when none is."""
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)  # type: ignore[arg-type]
            except ValueError:
                raise ConfigurationError(
                    f"The environment variable {name}={value!r} should be an integer; the launcher or the job "
                    "script set it wrongly."
                ) from None
    if default is None:
        raise ConfigurationError(
            f"None of the environment variables {', '.join(names)} is set, but this process was detected as "
            "started by a launcher that sets them. Start it through that launcher, or unset its other variables."
        )
    return default


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
    raise ConfigurationError(
        f"{launcher} started {world_size} processes{source}, but the Trainer is configured for "
        f"devices={num_devices} x num_nodes={num_nodes} = {expected}. Make the two agree: set "
        f"{suggest_layout(world_size, per_node)}, or {fix}"
    )


def check_per_node(launcher: str, per_node: int, variable: str, num_devices: int, fix: str) -> None:
    """Raise when the launcher's processes per node differ from ``devices``."""
    if per_node != num_devices:
        raise ConfigurationError(
            f"{launcher} started {per_node} processes per node ({variable}={per_node}), but the Trainer is "
            f"configured for devices={num_devices} per node. Set devices={per_node}, or {fix}"
        )
