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
        return parse_cpu_processes(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        count = devices if isinstance(devices, int) else parse_cpu_processes(devices)
        return [torch.device("cpu")] * count

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        return True
