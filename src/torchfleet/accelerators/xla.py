"""The XLA accelerator (TPUs, and XLA's CPU backend): registered as "xla" and, as Lightning names it, "tpu".

torch_xla is imported only when a device is counted or used, never when torchfleet is imported: where it is not
installed, asking for it gives ``xla_not_installed()``, one paragraph with the install command.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from torchfleet.accelerators.base import Accelerator, AcceleratorName
from torchfleet.errors import ConfigurationError

#: what installs an XLA environment (torch_xla 2.9 is built for torch 2.9; on x86_64 that torch is a CUDA build)
XLA_INSTALL = "pip install torch==2.9.1 torch_xla==2.9.0"
#: the environment variables that make XLA's CPU backend show devices (what tests/xla and scripts/xla_lane.sh set)
CPU_DEVICE_VARS = "PJRT_DEVICE=CPU CPU_NUM_DEVICES=2"


def xla_installed() -> bool:
    """Whether torch_xla can be found (without importing it)."""
    return importlib.util.find_spec("torch_xla") is not None


def xla_not_installed(what: str) -> ConfigurationError:
    """The one-paragraph error for ``what`` (e.g. "strategy='xla'") asked for where torch_xla is not installed."""
    return ConfigurationError(
        f"{what} needs torch_xla, which is not installed in this Python environment. torch_xla's newest release, "
        f"2.9.0, is built for torch 2.9: install both in an environment of their own with `{XLA_INSTALL}` (on x86_64 "
        "this torch is a CUDA build, about 4 GB). Supported: XLAStrategy(mode='launch'), one replica per XLA device "
        "as Lightning runs TPUs, and XLAStrategy(mode='spmd'), data parallel over a device mesh in one process; "
        "precision '32-true' and 'bf16-true'. Verified on XLA's CPU backend (" + CPU_DEVICE_VARS + "; "
        "scripts/xla_lane.sh); TPUs are untested."
    )


def _import_runtime() -> Any:
    try:
        from torch_xla import runtime
    except ImportError as exc:
        raise xla_not_installed("accelerator='xla'") from exc
    return runtime


def xla_device_count() -> int:
    """How many XLA devices this host has, read through torch_xla's runtime without starting it.

    The device type is PJRT_DEVICE (torch_xla picks one at import where it is unset). TPU: the chips' devices
    (torch_xla's own count); CPU: CPU_NUM_DEVICES (1 when unset); CUDA: GPU_NUM_DEVICES, else torch's count;
    others: the started runtime's count. Starting the runtime here would spoil a later launch, so it is only read
    where it already runs.
    """
    runtime = _import_runtime()
    kind = runtime.device_type()
    if kind == "TPU":
        from torch_xla._internal import tpu

        return int(tpu.num_available_devices())
    if kind == "CPU":
        return int(os.environ.get("CPU_NUM_DEVICES", "1"))
    if kind in ("CUDA", "GPU"):
        return int(os.environ.get("GPU_NUM_DEVICES", torch.cuda.device_count()))
    import torch_xla

    if torch_xla._XLAC._xla_runtime_is_initialized():
        return int(runtime.global_runtime_device_count())
    return 1


def parse_xla_devices(devices: Any, count: int) -> int | list[int]:
    """``devices`` for XLA, as Lightning accepts it: "auto" (every device), 1, ``count``, or one index ``[i]``."""
    value = devices
    if isinstance(value, str):
        text = value.strip()
        if text == "auto":
            return count
        try:
            value = int(text)
        except ValueError:
            try:
                value = [int(x) for x in text.split(",") if x.strip()]
            except ValueError:
                value = None
    if isinstance(value, int) and not isinstance(value, bool) and value in {1, count}:
        return value
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], int) and 0 <= value[0] < count:
        return [value[0]]
    raise ConfigurationError(
        f"devices={devices!r} is not valid for XLA: give 'auto', 1, {count} (every device this host has) or one "
        f"device index [<0-{count - 1}>]. (`devices` can only be 'auto', 1, {count} or [<0-{count - 1}>] for TPUs.) "
        "On XLA's CPU backend the count is CPU_NUM_DEVICES."
    )


class XLAAccelerator(Accelerator):
    """XLA devices through torch_xla's PJRT runtime: TPUs, or XLA's CPU backend (``PJRT_DEVICE=CPU``)."""

    name = AcceleratorName("xla")

    def __init__(self) -> None:
        if not xla_installed():
            raise xla_not_installed("accelerator='xla' (or 'tpu')")

    @staticmethod
    def parse_devices(devices: Any) -> int | list[int]:
        """'auto', 1, every device, or ``[i]`` (see ``parse_xla_devices``)."""
        return parse_xla_devices(devices, XLAAccelerator.auto_device_count())

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """``xla:0 .. xla:n-1`` (or ``[xla:i]``); the runtime's own device objects are taken in each replica."""
        if not isinstance(devices, (int, list)) or isinstance(devices, bool):
            devices = XLAAccelerator.parse_devices(devices)
        if isinstance(devices, list):
            return [torch.device("xla", devices[0])]
        return [torch.device("xla", i) for i in range(devices)]

    @staticmethod
    def auto_device_count() -> int:
        """Every XLA device of this host (``xla_device_count``)."""
        return xla_device_count()

    @staticmethod
    def is_available() -> bool:
        """Whether torch_xla is installed and counts at least one device."""
        if not xla_installed():
            return False
        try:
            return xla_device_count() > 0
        except (ImportError, ValueError, AssertionError, OSError, RuntimeError):
            # torch_xla installed against another torch fails at import (undefined symbol): not available here
            return False
