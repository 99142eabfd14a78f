"""AcceleratorRegistry and the choice of accelerator from the user's ``accelerator=``."""

from __future__ import annotations

from typing import Any

from torchfleet._registry import Registry
from torchfleet.accelerators.base import Accelerator
from torchfleet.accelerators.cpu import CPUAccelerator
from torchfleet.accelerators.cuda import CUDAAccelerator
from torchfleet.accelerators.mps import MPSAccelerator
from torchfleet.errors import ConfigurationError, unknown_name


class _AcceleratorRegistry(Registry[Accelerator]):
    """Accelerator names -> (class, init kwargs, description)."""

    def available_accelerators(self) -> list[str]:
        """Registered accelerator names, sorted."""
        return self.available()


#: The registry behind ``accelerator="name"``; packages add entries through the
#: ``torchfleet.accelerators`` entry-point group.
AcceleratorRegistry = _AcceleratorRegistry("accelerator", "torchfleet.accelerators", base=Accelerator)
AcceleratorRegistry.register("cpu", CPUAccelerator, description="The CPU; devices=k runs k processes.")
AcceleratorRegistry.register("cuda", CUDAAccelerator, description="NVIDIA (or ROCm) GPUs through torch.cuda.")
AcceleratorRegistry.register("mps", MPSAccelerator, description="Apple silicon GPUs through Metal.")

_SPECIAL = ("auto", "gpu")


def select_accelerator(value: Any = "auto") -> Accelerator:
    """The Accelerator for ``value``: an Accelerator object, a registered name, "gpu" or "auto"."""
    if isinstance(value, Accelerator):
        return value
    if not isinstance(value, str):
        raise ConfigurationError(
            f"accelerator={value!r} is not understood: pass a name ('auto', 'cpu', 'cuda', 'mps', 'gpu') or an "
            "Accelerator object."
        )
    name = value.lower()
    if name == "auto":
        for candidate in (CUDAAccelerator, MPSAccelerator):
            if candidate.is_available():
                return candidate()
        return CPUAccelerator()
    if name == "gpu":
        for candidate in (CUDAAccelerator, MPSAccelerator):
            if candidate.is_available():
                return candidate()
        raise ConfigurationError(
            "accelerator='gpu' was requested, but no GPU is available here (no CUDA device and no MPS). Use "
            "accelerator='cpu', or 'auto' to take a GPU when there is one."
        )
    if name not in AcceleratorRegistry:
        raise unknown_name("accelerator", value, list(AcceleratorRegistry.available()) + list(_SPECIAL))
    accelerator = AcceleratorRegistry.get(name)
    if not accelerator.is_available():
        raise ConfigurationError(
            f"accelerator={value!r} was requested, but {name} is not available here. Use accelerator='cpu', or "
            "'auto' to take the best device there is."
        )
    return accelerator
