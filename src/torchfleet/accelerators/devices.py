"""Parsing the user's ``devices`` argument. Pure functions: the device count is an argument."""

from __future__ import annotations

from typing import Any

from torchfleet.errors import ConfigurationError

_ACCEPTED_GPU = (
    "an int k >= 1 (the first k devices), -1 or '-1' (all devices), a list of distinct ids like [1, 3], a string "
    "like '1, 3' or '2,' (device 2 only), or 'auto'"
)
_ACCEPTED_CPU = "an int k >= 1 or a numeric string like '4' (k processes), or 'auto' (one process)"


def _gpu_error(devices: Any, kind: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"devices={devices!r} is not valid for {kind}: {why}. Accepted: {_ACCEPTED_GPU}.")


def _parse_int(text: str, devices: Any, kind: str) -> int:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        raise _gpu_error(devices, kind, f"{text!r} is not a device id") from None


def parse_gpu_ids(devices: Any, device_count: int, kind: str = "cuda") -> list[int]:
    """The device ids ``devices`` selects among ``device_count`` visible devices.

    ``k`` -> [0..k-1]; ``[1, 3]`` / ``"1, 3"`` -> [1, 3]; ``"2,"`` -> [2]; ``-1`` / ``"-1"`` /
    ``"auto"`` -> all. Everything else raises ConfigurationError saying what is accepted.
    """
    if isinstance(devices, bool) or isinstance(devices, float):
        raise _gpu_error(devices, kind, f"a {type(devices).__name__} is not a device count or id list")
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto":
            ids = list(range(device_count))
        elif text == "":
            raise _gpu_error(devices, kind, "the string is empty")
        elif "," in text:
            ids = [_parse_int(part, devices, kind) for part in text.split(",") if part.strip()]
            if not ids:
                raise _gpu_error(devices, kind, "the string names no device")
        else:
            return parse_gpu_ids(_parse_int(text, devices, kind), device_count, kind)
    elif isinstance(devices, int):
        if devices == -1:
            ids = list(range(device_count))
        elif devices < 1:
            raise _gpu_error(devices, kind, "ask for at least one device (0 means none; use accelerator='cpu' to "
                                            "train without a GPU)" if devices == 0 else "negative counts other "
                                            "than -1 have no meaning")
        else:
            if devices > device_count:
                raise ConfigurationError(
                    f"devices={devices} asks for {devices} {kind} devices but only {device_count} "
                    f"{'is' if device_count == 1 else 'are'} visible here. Use devices={device_count} or fewer, "
                    "or -1 for all of them."
                )
            ids = list(range(devices))
    elif isinstance(devices, (list, tuple)):
        if not devices:
            raise _gpu_error(devices, kind, "the list is empty")
        bad = [d for d in devices if isinstance(d, bool) or not isinstance(d, int)]
        if bad:
            raise _gpu_error(devices, kind, f"{bad[0]!r} is not an int device id")
        ids = list(devices)
    else:
        raise _gpu_error(devices, kind, f"a {type(devices).__name__} is not understood")
    if not ids and device_count == 0:
        raise ConfigurationError(f"devices={devices!r} asks for {kind} devices, but none is visible here.")
    negative = [i for i in ids if i < 0]
    if negative:
        raise _gpu_error(devices, kind, f"device ids cannot be negative ({negative[0]})")
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise _gpu_error(devices, kind, f"device {dup} is listed twice")
    beyond = [i for i in ids if i >= device_count]
    if beyond:
        visible = f"ids 0..{device_count - 1}" if device_count else "none"
        raise ConfigurationError(
            f"devices={devices!r} asks for {kind} device {beyond[0]}, but only {device_count} "
            f"{'is' if device_count == 1 else 'are'} visible here ({visible}). Check CUDA_VISIBLE_DEVICES, or "
            "choose ids below the device count."
        )
    return ids


def parse_cpu_processes(devices: Any) -> int:
    """The number of CPU processes ``devices`` asks for (``"auto"`` -> 1).

    A list of ids means nothing on CPU and is refused; so is -1, because "all CPUs" as one
    process per core is rarely what a user wants — give the count.
    """
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto":
            return 1
        try:
            devices = int(text)
        except ValueError:
            raise ConfigurationError(f"devices={devices!r} is not valid for the CPU. Accepted: {_ACCEPTED_CPU}.") from None
    if isinstance(devices, bool) or not isinstance(devices, int):
        extra = " A list of device ids applies to GPUs; on the CPU, give a number of processes." if isinstance(
            devices, (list, tuple)) else ""
        raise ConfigurationError(f"devices={devices!r} is not valid for the CPU.{extra} Accepted: {_ACCEPTED_CPU}.")
    if devices == -1:
        raise ConfigurationError(
            "devices=-1 ('all devices') is not used on the CPU: a process per core is rarely what you want. Give the "
            "number of processes, e.g. devices=2, or 'auto' for one."
        )
    if devices < 1:
        raise ConfigurationError(f"devices={devices!r} is not valid for the CPU. Accepted: {_ACCEPTED_CPU}.")
    return devices
