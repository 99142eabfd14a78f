"""The MPS accelerator (Apple silicon GPUs): one device."""

from __future__ import annotations

from typing import Any

import torch

from torchfleet.accelerators.base import Accelerator, AcceleratorName
from torchfleet.accelerators.devices import parse_gpu_ids


def _mps_available() -> bool:
    # read at call time, so tests can patch torch.backends.mps.is_available
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


class MPSAccelerator(Accelerator):
    """Train on an Apple GPU through the Metal backend (a Mac has at most one, id 0)."""

    name = AcceleratorName("mps")

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        """The MPS device ids ``devices`` selects: only ``[0]`` can exist."""
        return parse_gpu_ids(devices, MPSAccelerator.auto_device_count(), "mps")

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """``torch.device("mps", 0)`` when selected."""
        return [torch.device("mps", i) for i in MPSAccelerator.parse_devices(devices)]

    @staticmethod
    def auto_device_count() -> int:
        """1 where MPS is available, else 0."""
        return 1 if _mps_available() else 0

    @staticmethod
    def is_available() -> bool:
        """Whether this machine has a usable MPS device."""
        return _mps_available()
