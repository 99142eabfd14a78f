"""The Accelerator interface: one kind of hardware (cpu, cuda, mps) and how to count and pick its devices."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch


class AcceleratorName(str):
    """A registry name that is also Lightning's static ``name()``: ``CPUAccelerator.name == "cpu" == CPUAccelerator.name()``."""

    __slots__ = ()

    def __call__(self) -> str:
        return str(self)


def accelerator_name(accelerator: Any) -> str:
    """The name of ``accelerator``: our classes' ``name`` string, or what a Lightning-style static ``name()`` returns."""
    name = accelerator.name
    return str(name() if callable(name) else name)


class Accelerator(ABC):
    """One kind of device. Stateless apart from configuration; a Strategy holds exactly one.

    The static methods read the machine at call time (never at import), so a test can change
    what they see by patching the one counting function of the backend (for CUDA,
    ``torch.cuda.device_count``). Register a subclass in ``AcceleratorRegistry`` to make it
    selectable by name.
    """

    #: registry name, e.g. "cpu", "cuda", "mps"; callable too, as Lightning's static ``name()``. Read it through
    #: ``accelerator_name``: a subclass written for Lightning defines ``name()`` as a static method
    name: ClassVar[str] = AcceleratorName("")

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` current for this process (e.g. ``torch.cuda.set_device``). Called once per rank."""

    def setup(self, trainer: Any) -> None:
        """Called by ``Strategy.setup(trainer)`` in every Trainer stage, before the model is placed (Lightning's hook)."""

    def teardown(self) -> None:
        """Release what ``setup_device`` took (caches, handles)."""

    @staticmethod
    @abstractmethod
    def parse_devices(devices: Any) -> int | list[int]:
        """Turn the user's ``devices`` spec into a process count (cpu) or a list of device ids (gpus).

        Raises ConfigurationError with what was given and what is accepted.
        """

    @staticmethod
    @abstractmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """The torch devices for ``devices`` (parsed or not; one per local process)."""

    @staticmethod
    @abstractmethod
    def auto_device_count() -> int:
        """How many devices ``devices="auto"`` means."""

    @staticmethod
    @abstractmethod
    def is_available() -> bool:
        """Whether this kind of device exists here. Counts devices; never initialises one."""

    def get_device_stats(self, device: torch.device) -> dict[str, Any]:
        """Memory and utilisation figures for ``device``; empty where the backend reports none."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
