"""Parsing the user's ``devices`` argument. Pure functions: the device count is an argument.

The accepted forms for GPUs (cuda, mps), with 4 visible devices:

=================  ================  ==========================================
``devices=``       ids               meaning
=================  ================  ==========================================
``3``              ``[0, 1, 2]``     the first 3 devices
``"3"``            ``[0, 1, 2]``     the same, as a string (command lines)
``[1, 3]``         ``[1, 3]``        devices 1 and 3
``"1, 3"``         ``[1, 3]``        the same, as a string
``"2,"``           ``[2]``           device 2 only (a trailing comma means ids)
``-1`` / ``"-1"``  ``[0, 1, 2, 3]``  every visible device
``"auto"``         ``[0, 1, 2, 3]``  every visible device
=================  ================  ==========================================

On the CPU ``devices`` is a number of processes: ``k`` or ``"k"``, and ``"auto"`` is one.
"""

from __future__ import annotations

import operator
import os
from typing import Any

from torchfleet.errors import ConfigurationError, DevicesTypeError

_ACCEPTED_GPU = (
    "an int k >= 1 (the first k devices), -1 or '-1' (all devices), 'auto' (all devices), a list of distinct "
    "ids like [1, 3], or a string of ids like '1, 3' or '2,' (device 2 only)"
)
_ACCEPTED_CPU = "an int k >= 1 or a numeric string like '4' (k processes), or 'auto' (one process)"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _gpu_error(devices: Any, kind: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"devices={devices!r} is not valid for {kind}: {why}. Accepted: {_ACCEPTED_GPU}.")


def _gpu_type_error(devices: Any, kind: str, why: str) -> DevicesTypeError:
    # "must be an int, a string, a sequence of ints, but you passed" is Lightning's key phrase (its TypeError)
    return DevicesTypeError(
        f"devices={devices!r} is not valid for {kind}: {why}. Device ids must be an int, a string, a sequence of "
        f"ints, but you passed {devices!r}. Accepted: {_ACCEPTED_GPU}."
    )


def _as_int(value: Any) -> int | None:
    """``value`` as an int when it is an integer (numpy ints included) but not a bool; else None."""
    if isinstance(value, (bool, float, str)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _parse_id(text: str, devices: Any, kind: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise _gpu_error(devices, kind, f"{text.strip()!r} is not a device id") from None


def _none_visible(devices: Any, kind: str) -> ConfigurationError:
    return ConfigurationError(
        f"devices={devices!r} asks for {kind} devices, but none is visible here (torch sees 0 {kind} devices). "
        "Use accelerator='cpu', or accelerator='auto' to take a GPU only where there is one; if this machine has "
        "GPUs, check the driver, the torch build and CUDA_VISIBLE_DEVICES."
    )


def _check_ids(ids: list[int], devices: Any, device_count: int, kind: str) -> list[int]:
    negative = [i for i in ids if i < 0]
    if negative:
        raise _gpu_error(devices, kind, f"device ids cannot be negative ({negative[0]})")
    seen: set[int] = set()
    for i in ids:
        if i in seen:
            raise _gpu_error(devices, kind, f"device {i} is listed twice")
        seen.add(i)
    if device_count == 0:
        raise _none_visible(devices, kind)
    beyond = [i for i in ids if i >= device_count]
    if beyond:
        raise ConfigurationError(
            f"devices={devices!r} asks for {kind} device {beyond[0]}, but only {device_count} "
            f"{'is' if device_count == 1 else 'are'} visible here (ids 0..{device_count - 1}). Choose ids below "
            f"{device_count}; ids count from 0 among the devices CUDA_VISIBLE_DEVICES leaves visible."
        )
    return ids


def _parse_count(count: int, devices: Any, device_count: int, kind: str) -> list[int]:
    if count == -1:
        if device_count == 0:
            raise _none_visible(devices, kind)
        return list(range(device_count))
    if count == 0:  # Lightning's key phrase inside: "`Trainer(devices=0)` value is not a valid input using ..."
        raise _gpu_error(
            devices, kind, "ask for at least one device (0 means none; use accelerator='cpu' to train without a GPU; "
            f"the `Trainer(devices={devices!r})` value is not a valid input using {kind} accelerator)"
        )
    if count < 0:
        raise _gpu_error(devices, kind, f"negative counts other than -1 have no meaning ({count})")
    if device_count == 0:
        raise _none_visible(devices, kind)
    if count > device_count:
        raise ConfigurationError(
            f"devices={devices!r} asks for {_plural(count, kind + ' device')}, but only {device_count} "
            f"{'is' if device_count == 1 else 'are'} visible here. Use devices={device_count} or fewer, or -1 for "
            "all of them."
        )
    return list(range(count))


def parse_gpu_ids(devices: Any, device_count: int, kind: str = "cuda") -> list[int]:
    """The device ids ``devices`` selects among ``device_count`` visible devices of type ``kind``.

    ``k`` -> [0..k-1]; ``[1, 3]`` / ``"1, 3"`` -> [1, 3]; ``"2,"`` -> [2]; ``-1`` / ``"-1"`` /
    ``"auto"`` -> all. Zero, empty, negative (other than -1), duplicate, float, bool and
    non-numeric values, ids at or beyond ``device_count``, more devices than exist, and any
    GPU request when ``device_count`` is 0 raise ConfigurationError saying what is accepted (a value of a type
    that names no device, DevicesTypeError: also a TypeError).
    """
    if isinstance(devices, str):
        text = devices.strip()
        if text.lower() == "auto":
            return _parse_count(-1, devices, device_count, kind)
        if text == "":
            raise _gpu_error(devices, kind, "the string is empty")
        if "," in text:
            # a comma makes the string a list of ids, so "2," is device 2 and not "two devices"
            ids = [_parse_id(part, devices, kind) for part in text.split(",") if part.strip()]
            if not ids:
                raise _gpu_error(devices, kind, "the string names no device")
            return _check_ids(ids, devices, device_count, kind)
        return _parse_count(_parse_id(text, devices, kind), devices, device_count, kind)
    if isinstance(devices, (bool, float)):
        raise _gpu_type_error(devices, kind, f"a {type(devices).__name__} is neither a device count nor a list of ids")
    count = _as_int(devices)
    if count is not None:
        return _parse_count(count, devices, device_count, kind)
    if isinstance(devices, (list, tuple)):
        if not devices:
            raise _gpu_error(devices, kind, f"the list is empty (the `Trainer(devices={devices!r})` value is not a "
                                            f"valid input using {kind} accelerator)")
        ids = []
        for item in devices:
            as_int = _as_int(item)
            if as_int is None:
                raise _gpu_type_error(devices, kind, f"{item!r} is not an int device id")
            ids.append(as_int)
        return _check_ids(ids, devices, device_count, kind)
    raise _gpu_type_error(devices, kind, f"a {type(devices).__name__} is not understood")


def parse_cpu_processes(devices: Any) -> int:
    """The number of CPU processes ``devices`` asks for: ``k`` or ``"k"`` -> k, ``"auto"`` -> 1.

    A list of ids is refused (ids pick GPUs; the CPU takes a count), and so is -1: "all
    devices" as one process per core is rarely what a user wants and would start dozens of
    processes on a large machine, so torchfleet asks for the number (as Lightning does).
    """
    if isinstance(devices, str):
        text = devices.strip()
        if text.lower() == "auto":
            return 1
        try:
            devices = int(text)
        except ValueError:
            raise ConfigurationError(
                f"devices={devices!r} is not valid for the CPU. Accepted: {_ACCEPTED_CPU}."
            ) from None
    if isinstance(devices, (list, tuple)):
        raise ConfigurationError(
            f"devices={devices!r} is not valid for the CPU: the CPU takes a count, not device ids (a list of ids "
            f"picks GPUs), so the `Trainer(devices={devices!r})` value is not a valid input using cpu accelerator. "
            f"Give the number of processes, e.g. devices={max(len(devices), 1)}. Accepted: {_ACCEPTED_CPU}."
        )
    count = None if isinstance(devices, (bool, float)) else _as_int(devices)
    if count is None:
        raise ConfigurationError(f"devices={devices!r} is not valid for the CPU. Accepted: {_ACCEPTED_CPU}.")
    if count == -1:
        raise ConfigurationError(
            "devices=-1 ('all devices') is not used on the CPU: one process per core is rarely what you want. Give "
            "the number of processes, e.g. devices=2, or 'auto' for one."
        )
    if count < 1:
        raise ConfigurationError(
            f"devices={devices!r} is not valid for the CPU: ask for at least one process (`Trainer(devices="
            f"{devices!r})` value is not a valid input using cpu accelerator). Accepted: {_ACCEPTED_CPU}."
        )
    most = max_cpu_processes()
    if count > most:
        # each process imports torch and holds a copy of the model: thousands would exhaust the machine first
        raise ConfigurationError(
            f"devices={devices!r} is not valid for the CPU: {count} processes on a machine with {os.cpu_count()} "
            f"cores is more than torchfleet starts on one node (at most {most}: 4 per core, never fewer than 64). "
            f"Give a count up to {most}, or more machines (num_nodes)."
        )
    return count


def max_cpu_processes() -> int:
    """The most CPU processes one node starts: 4 per core (oversubscribing, as tests do), at least 64."""
    return max(64, 4 * (os.cpu_count() or 1))
