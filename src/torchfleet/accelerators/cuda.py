"""The CUDA accelerator. Devices are counted through torch.cuda at call time and never initialised here."""

from __future__ import annotations

import logging
from typing import Any

import torch

from torchfleet.accelerators.base import Accelerator
from torchfleet.accelerators.devices import parse_gpu_ids
from torchfleet.errors import ConfigurationError

log = logging.getLogger(__name__)


def cuda_device_count() -> int:
    """Visible CUDA devices (0 without CUDA). Fork-safe: it does not initialise CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class CUDAAccelerator(Accelerator):
    """Train on NVIDIA (or ROCm) GPUs through torch.cuda."""

    name = "cuda"

    def setup_device(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ConfigurationError(f"CUDAAccelerator got device {device}; it drives cuda devices only.")
        torch.cuda.set_device(device)

    def teardown(self) -> None:
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        return parse_gpu_ids(devices, cuda_device_count(), "cuda")

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        ids = devices if isinstance(devices, list) else CUDAAccelerator.parse_devices(devices)
        return [torch.device("cuda", i) for i in ids]

    @staticmethod
    def auto_device_count() -> int:
        return cuda_device_count()

    @staticmethod
    def is_available() -> bool:
        return cuda_device_count() > 0

    def get_device_stats(self, device: torch.device) -> dict[str, Any]:
        if not torch.cuda.is_initialized():
            return {}
        return dict(torch.cuda.memory_stats(device))


def find_usable_cuda_devices(num_devices: int = -1) -> list[int]:
    """Ids of ``num_devices`` CUDA devices that can allocate memory now (-1: all usable ones).

    Busy devices (exclusive mode, out of memory) are skipped. Raises ConfigurationError when
    fewer than ``num_devices`` are usable. This initialises CUDA: call it before forking.
    """
    if num_devices == 0:
        return []
    count = cuda_device_count()
    if count == 0:
        raise ConfigurationError(
            "find_usable_cuda_devices() found no CUDA device here. Train with accelerator='cpu', or check that the "
            "NVIDIA driver and a CUDA build of torch are installed."
        )
    usable: list[int] = []
    for index in range(count):
        try:
            torch.tensor([0], device=torch.device("cuda", index))
        except RuntimeError as exc:
            log.debug("CUDA device %d is not usable: %s", index, exc)
            continue
        usable.append(index)
        if num_devices != -1 and len(usable) == num_devices:
            break
    if num_devices != -1 and len(usable) < num_devices:
        raise ConfigurationError(
            f"find_usable_cuda_devices({num_devices}) found only {len(usable)} usable of {count} CUDA devices "
            f"({usable}); the others are busy or failing. Ask for fewer, or free them."
        )
    return usable
