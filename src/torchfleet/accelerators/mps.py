"""The MPS accelerator (Apple silicon GPUs): one device."""

from __future__ import annotations

from typing import Any

import torch

from torchfleet.accelerators.base import Accelerator
from torchfleet.accelerators.devices import parse_gpu_ids


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


class MPSAccelerator(Accelerator):
    """Train on an Apple GPU through the Metal backend."""

    name = "mps"

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        return parse_gpu_ids(devices, 1 if _mps_available() else 0, "mps")

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        ids = devices if isinstance(devices, list) else MPSAccelerator.parse_devices(devices)
        return [torch.device("mps", i) for i in ids]

    @staticmethod
    def auto_device_count() -> int:
        return 1 if _mps_available() else 0

    @staticmethod
    def is_available() -> bool:
        return _mps_available()
