"""AcceleratorRegistry and the choice of accelerator from the user's ``accelerator=``."""

from __future__ import annotations

from typing import Any

from torchfleet._registry import Registry
from torchfleet.accelerators.base import Accelerator, accelerator_name
from torchfleet.accelerators.cpu import CPUAccelerator
from torchfleet.accelerators.cuda import CUDAAccelerator
from torchfleet.accelerators.mps import MPSAccelerator
from torchfleet.accelerators.xla import XLAAccelerator
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
# torch_xla is imported only when the accelerator is built (its constructor says how to install it where it is missing)
AcceleratorRegistry.register("xla", XLAAccelerator, description="XLA devices through torch_xla (TPUs; XLA's CPU backend).")
AcceleratorRegistry.register("tpu", XLAAccelerator, description="Lightning's name for the XLA accelerator (TPUs).")

#: names select_accelerator understands besides the registered ones
SPECIAL_NAMES = ("auto", "gpu")

# "gpu" and "auto" prefer CUDA over MPS: a machine with both is not known to exist, but CUDA is the common case
_GPU_PREFERENCE = (CUDAAccelerator, MPSAccelerator)


def _first_gpu() -> Accelerator | None:
    for candidate in _GPU_PREFERENCE:
        if candidate.is_available():
            return candidate()
    return None


def select_accelerator(value: Any = "auto") -> Accelerator:
    """The Accelerator for ``value``: an Accelerator object (returned as is), a registered name, "gpu" or "auto".

    "auto" takes cuda, else mps, else cpu; "gpu" takes cuda, else mps, else raises. A
    registered name whose device is missing here raises, suggesting "cpu" or "auto". Names
    are matched exactly first, then in lower case; an unknown name raises with the closest
    valid name.
    """
    if isinstance(value, Accelerator):
        if not value.is_available():  # as Lightning, the object is asked too (a subclass of yours may say no)
            raise ConfigurationError(
                f"accelerator={type(value).__name__}() was given, but its is_available() returned False: "
                f"{accelerator_name(value) or type(value).__name__} devices are not available here. Pass an "
                "accelerator this machine has (accelerator='cpu', or 'auto' for the best one found)."
            )
        return value
    if isinstance(value, type) and issubclass(value, Accelerator):
        raise ConfigurationError(
            f"accelerator={value.__name__} is a class; pass an instance, accelerator={value.__name__}(), or its "
            "registered name."
        )
    if not isinstance(value, str):
        raise ConfigurationError(
            f"accelerator={value!r} is not understood: pass a name ('auto', 'cpu', 'cuda', 'mps', 'gpu', or one "
            "registered in AcceleratorRegistry) or an Accelerator object."
        )
    name = value.strip()
    if name not in AcceleratorRegistry and name.lower() in AcceleratorRegistry:
        name = name.lower()
    if name.lower() == "auto":
        return _first_gpu() or CPUAccelerator()
    if name.lower() == "gpu":
        gpu = _first_gpu()
        if gpu is None:
            raise ConfigurationError(
                f"accelerator={value!r} was requested, but no GPU is available here (torch sees no CUDA device and "
                "no MPS device): No supported gpu backend found! Use accelerator='cpu', or 'auto' to take a GPU only "
                "where there is one."
            )
        return gpu
    if name not in AcceleratorRegistry:
        raise unknown_name("accelerator", value, [*AcceleratorRegistry.available(), *SPECIAL_NAMES],
                           hint=f"(You selected an invalid accelerator name: `accelerator={value!r}`.)")
    accelerator = AcceleratorRegistry.get(name)
    if not accelerator.is_available():
        raise ConfigurationError(
            f"accelerator={value!r} was requested, but {name} is not available here (`{type(accelerator).__name__}` "
            "can not run on your system since the accelerator is not available). Use accelerator='cpu', or 'auto' to "
            "take the best device there is."
        )
    return accelerator
