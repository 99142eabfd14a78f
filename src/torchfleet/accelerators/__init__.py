"""Accelerators: the kinds of device torchfleet trains on, and how ``devices=`` selects them."""

from torchfleet.accelerators.base import Accelerator
from torchfleet.accelerators.cpu import CPUAccelerator
from torchfleet.accelerators.cuda import CUDAAccelerator, find_usable_cuda_devices
from torchfleet.accelerators.mps import MPSAccelerator
from torchfleet.accelerators.registry import AcceleratorRegistry, select_accelerator
from torchfleet.accelerators.xla import XLAAccelerator

__all__ = [
    "Accelerator",
    "CPUAccelerator",
    "CUDAAccelerator",
    "MPSAccelerator",
    "XLAAccelerator",
    "AcceleratorRegistry",
    "find_usable_cuda_devices",
    "select_accelerator",
]
