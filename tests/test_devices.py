"""The devices table (README "Choosing devices"), accelerator choice and find_usable_cuda_devices, on a CPU machine.

GPU paths run against patched torch.cuda.is_available/device_count: selection logic only, no device is touched.
"""

from __future__ import annotations

import pytest
import torch

from torchfleet.accelerators import (
    Accelerator,
    AcceleratorRegistry,
    CPUAccelerator,
    CUDAAccelerator,
    MPSAccelerator,
    find_usable_cuda_devices,
    select_accelerator,
)
from torchfleet.accelerators.devices import parse_cpu_processes, parse_gpu_ids
from torchfleet.errors import ConfigurationError


@pytest.mark.parametrize(
    "devices, expected",
    [
        (3, [0, 1, 2]),
        (1, [0]),
        ([1, 3], [1, 3]),
        ((0, 2), [0, 2]),
        ("1, 3", [1, 3]),
        ("1,3", [1, 3]),
        ("2,", [2]),
        ("3", [0, 1, 2]),
        (-1, [0, 1, 2, 3]),
        ("-1", [0, 1, 2, 3]),
        ("auto", [0, 1, 2, 3]),
        ([0], [0]),
    ],
)
def test_devices_table(devices, expected):
    assert parse_gpu_ids(devices, 4) == expected


@pytest.mark.parametrize(
    "devices, match",
    [
        (0, "at least one device"),
        ("0", "at least one device"),
        ([], "empty"),
        ("", "empty"),
        (-2, "negative"),
        ("-3", "negative"),
        ([1, 1], "listed twice"),
        ("1,1", "listed twice"),
        (1.0, "float"),
        (True, "bool"),
        ("two", "not a device id"),
        ([0, "1"], "not an int"),
        ([4], "only 4 are visible"),
        ("0, 7", "device 7"),
        (5, "only 4 are visible"),
        ({0: 1}, "dict"),
        ([-1], "negative"),
    ],
)
def test_devices_errors_say_what_is_accepted(devices, match):
    with pytest.raises(ConfigurationError, match=match):
        parse_gpu_ids(devices, 4)


def test_error_lists_accepted_forms():
    with pytest.raises(ConfigurationError) as info:
        parse_gpu_ids(0, 4)
    text = str(info.value)
    assert "Accepted" in text and "'2,'" in text and "-1" in text


def test_no_gpus_visible():
    with pytest.raises(ConfigurationError, match="none is visible|only 0"):
        parse_gpu_ids("auto", 0)
    with pytest.raises(ConfigurationError, match="only 0"):
        parse_gpu_ids(1, 0)


@pytest.mark.parametrize("devices, expected", [(1, 1), (4, 4), ("2", 2), ("auto", 1), (" 3 ", 3)])
def test_cpu_process_counts(devices, expected):
    assert parse_cpu_processes(devices) == expected


@pytest.mark.parametrize("devices, match", [(0, "not valid"), ([0, 1], "CPU takes a count|number of processes"),
                                            (-1, "not used on the CPU"), (1.5, "not valid"), ("x", "not valid"),
                                            (False, "not valid")])
def test_cpu_devices_errors(devices, match):
    with pytest.raises(ConfigurationError, match=match):
        parse_cpu_processes(devices)


@pytest.fixture
def gpus(monkeypatch):
    def set_count(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return set_count


def test_auto_and_gpu_choice(gpus):
    gpus(0)
    assert isinstance(select_accelerator("auto"), CPUAccelerator) or MPSAccelerator.is_available()
    with pytest.raises(ConfigurationError, match="no GPU is available"):
        select_accelerator("gpu")
    with pytest.raises(ConfigurationError, match="cuda is not available"):
        select_accelerator("cuda")
    gpus(1)
    assert isinstance(select_accelerator("auto"), CUDAAccelerator)
    assert isinstance(select_accelerator("gpu"), CUDAAccelerator)
    gpus(4)
    acc = select_accelerator("cuda")
    assert acc.parse_devices(2) == [0, 1]
    assert acc.get_parallel_devices([1, 3]) == [torch.device("cuda", 1), torch.device("cuda", 3)]
    assert acc.auto_device_count() == 4
    assert not torch.cuda.is_initialized()


def test_mps_not_available_here():
    if MPSAccelerator.is_available():
        pytest.skip("this machine has MPS; the test checks the refusal on machines without it")
    with pytest.raises(ConfigurationError, match="mps is not available"):
        select_accelerator("mps")


def test_unknown_accelerator_suggests_closest():
    with pytest.raises(ConfigurationError, match="Did you mean 'cuda'"):
        select_accelerator("cdua")
    with pytest.raises(ConfigurationError, match="not understood"):
        select_accelerator(3)


def test_custom_accelerator_registered_and_selected():
    class Fancy(CPUAccelerator):
        name = "fancy"

    AcceleratorRegistry.register("fancy", Fancy, description="a CPU with a new name")
    try:
        a, b = select_accelerator("fancy"), select_accelerator("fancy")
        assert isinstance(a, Fancy) and a is not b
        assert "fancy" in AcceleratorRegistry.available_accelerators()
        obj = Fancy()
        assert select_accelerator(obj) is obj
    finally:
        AcceleratorRegistry.remove("fancy")


def test_accelerator_is_abstract():
    with pytest.raises(TypeError):
        Accelerator()


def test_find_usable_cuda_devices_skips_busy(gpus, monkeypatch):
    gpus(3)
    real_tensor = torch.tensor

    def fake_tensor(data, device=None, **kw):
        if device is not None and torch.device(device).type == "cuda":
            if torch.device(device).index == 1:
                raise RuntimeError("CUDA error: all CUDA-capable devices are busy or unavailable")
            return real_tensor(data)
        return real_tensor(data, **kw)

    monkeypatch.setattr(torch, "tensor", fake_tensor)
    assert find_usable_cuda_devices(2) == [0, 2]
    assert find_usable_cuda_devices(-1) == [0, 2]
    with pytest.raises(ConfigurationError, match="found only 2 usable of 3"):
        find_usable_cuda_devices(3)
    gpus(0)
    with pytest.raises(ConfigurationError, match="no CUDA device"):
        find_usable_cuda_devices(1)
