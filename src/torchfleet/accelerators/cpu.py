"""The CPU accelerator: ``devices=k`` means k processes on this machine's CPU."""

from __future__ import annotations

from typing import Any

import torch

from torchfleet.accelerators.base import Accelerator
from torchfleet.accelerators.devices import parse_cpu_processes


class CPUAccelerator(Accelerator):
    """Train on the CPU; one process per requested device."""

    name = "cpu"

    @staticmethod
    def parse_devices(devices: Any) -> int:
        """The number of processes (see ``parse_cpu_processes``: ``"auto"`` is 1, -1 and lists are refused)."""
        return parse_cpu_processes(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """``torch.device("cpu")`` once per process."""
        return [torch.device("cpu")] * parse_cpu_processes(devices)

    @staticmethod
    def auto_device_count() -> int:
        """One process: more CPU processes on one machine rarely train faster, so it is asked for explicitly."""
        return 1

    @staticmethod
    def is_available() -> bool:
        """Always true."""
        return True
