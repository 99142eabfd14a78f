"""The CUDA accelerator. Devices are counted through torch.cuda at call time and never initialised here."""

from __future__ import annotations

import logging
from typing import Any

import torch

from torchfleet.accelerators.base import Accelerator, AcceleratorName
from torchfleet.accelerators.devices import parse_gpu_ids
from torchfleet.errors import ConfigurationError

log = logging.getLogger(__name__)


def cuda_device_count() -> int:
    """Visible CUDA devices (0 without CUDA), read now and never cached; counting does not initialise CUDA.

    Only ``torch.cuda.device_count()`` is asked: it counts through NVML and leaves the process
    safe to fork. ``torch.cuda.is_available()`` is avoided on purpose, because unless
    PYTORCH_NVML_BASED_CUDA_CHECK=1 is set it calls cudaGetDeviceCount, which starts the CUDA
    driver in this process and breaks the fork-based strategies. A count above 0 already
    implies a CUDA build of torch, so the count alone answers "is CUDA available".
    """
    return max(int(torch.cuda.device_count()), 0)


def num_cuda_devices() -> int:
    """Lightning's name for ``cuda_device_count``: the visible CUDA devices, counted without initialising CUDA."""
    return cuda_device_count()


def is_cuda_available() -> bool:
    """Whether a CUDA device is visible, asked without initialising CUDA (so fork-based strategies still work)."""
    return cuda_device_count() > 0


class CUDAAccelerator(Accelerator):
    """Train on NVIDIA (or ROCm) GPUs through torch.cuda."""

    name = AcceleratorName("cuda")

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` this process's current CUDA device."""
        device = torch.device(device)
        if device.type != "cuda":
            raise ConfigurationError(
                f"CUDAAccelerator.setup_device got device {str(device)!r}; it drives cuda devices only. Use the "
                "accelerator that matches the device (e.g. CPUAccelerator for 'cpu')."
            )
        torch.cuda.set_device(device)

    def teardown(self) -> None:
        """Return cached, unused memory to the driver (only if this process used CUDA)."""
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        """The CUDA device ids ``devices`` selects (see ``accelerators.devices``)."""
        return parse_gpu_ids(devices, cuda_device_count(), "cuda")

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """One ``torch.device("cuda", i)`` per selected id."""
        return [torch.device("cuda", i) for i in CUDAAccelerator.parse_devices(devices)]

    @staticmethod
    def auto_device_count() -> int:
        """Every visible CUDA device."""
        return cuda_device_count()

    @staticmethod
    def is_available() -> bool:
        """Whether at least one CUDA device is visible (without initialising CUDA)."""
        return cuda_device_count() > 0

    def get_device_stats(self, device: torch.device) -> dict[str, Any]:
        """``torch.cuda.memory_stats(device)``; empty before this process has used CUDA."""
        # reading stats must not be what initialises CUDA (that would break a later fork)
        if not torch.cuda.is_initialized():
            return {}
        return dict(torch.cuda.memory_stats(device))


def _can_allocate(index: int) -> bool:
    """Whether a tiny tensor can be created on CUDA device ``index`` now."""
    try:
        torch.tensor([0], device=torch.device("cuda", index))
    except RuntimeError as exc:  # busy, exclusive-process, out of memory, or a failing device
        log.debug("CUDA device %d is not usable: %s", index, exc)
        return False
    return True


def find_usable_cuda_devices(num_devices: int = -1) -> list[int]:
    """Ids of ``num_devices`` CUDA devices that can allocate memory now (-1: every usable one).

    Each visible device is tried with a tiny allocation; busy ones (exclusive-process mode
    held by another job, out of memory, failing) are skipped. Pass the result as
    ``devices=``. Raises ConfigurationError when fewer than ``num_devices`` are usable, or
    none at all for -1. This initialises CUDA in the calling process, so strategies that
    fork (``ddp_fork``, ``ddp_notebook``) cannot be used after it: prefer ``ddp`` or
    ``ddp_spawn`` with it.
    """
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < -1:
        raise ConfigurationError(
            f"find_usable_cuda_devices(num_devices={num_devices!r}) is not valid: pass an int >= 0, or -1 for every "
            "usable device."
        )
    if num_devices == 0:
        return []
    count = cuda_device_count()
    if count == 0:
        raise ConfigurationError(
            "find_usable_cuda_devices() found no CUDA device here. Train with accelerator='cpu', or check that the "
            "NVIDIA driver and a CUDA build of torch are installed and that CUDA_VISIBLE_DEVICES is not empty."
        )
    if num_devices > count:
        raise ConfigurationError(
            f"find_usable_cuda_devices({num_devices}) asks for {num_devices} devices, but only {count} "
            f"{'is' if count == 1 else 'are'} visible here. Ask for {count} or fewer, or -1 for every usable one."
        )
    usable: list[int] = []
    for index in range(count):
        if _can_allocate(index):
            usable.append(index)
            if len(usable) == num_devices:
                break
    wanted = 1 if num_devices == -1 else num_devices
    if len(usable) < wanted:
        raise ConfigurationError(
            f"find_usable_cuda_devices({num_devices}) found only {len(usable)} usable of {count} CUDA devices "
            f"({usable}); the others are busy (another process holds them in exclusive mode), out of memory or "
            "failing. Ask for fewer, wait for them to be free, or check nvidia-smi."
        )
    return usable
