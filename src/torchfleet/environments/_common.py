"""Helpers shared by the environments that read a world size from the scheduler."""

from __future__ import annotations

import os

from torchfleet.errors import ConfigurationError


def env_int(*names: str, default: int | None = None) -> int:
    """The first of ``names`` set in the environment, as an int."""
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)  # type: ignore[arg-type]
    if default is None:
        raise KeyError(f"none of {', '.join(names)} is set")
    return default


def check_world_size(launcher: str, world_size: int, num_devices: int, num_nodes: int, fix: str) -> None:
    """Raise when the launcher started a different number of processes than devices x num_nodes."""
    if world_size != num_devices * num_nodes:
        raise ConfigurationError(
            f"{launcher} started {world_size} processes, but the Trainer is configured for devices={num_devices} x "
            f"num_nodes={num_nodes} = {num_devices * num_nodes}. Make the two agree: {fix}"
        )
