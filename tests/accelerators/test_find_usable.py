"""find_usable_cuda_devices with patched device counts and allocations (no GPU touched)."""

from __future__ import annotations

import pytest

import torchfleet.accelerators.cuda as cuda_module
from torchfleet.accelerators import find_usable_cuda_devices
from torchfleet.errors import ConfigurationError


@pytest.fixture
def busy(monkeypatch):
    """Call with a set of busy ids: allocations on them fail like an exclusive-mode GPU held elsewhere."""
    tried: list[int] = []

    def set_busy(ids: set[int]) -> list[int]:
        real = cuda_module.torch.tensor

        def fake_tensor(data, device=None, **kwargs):
            if device is not None and cuda_module.torch.device(device).type == "cuda":
                index = cuda_module.torch.device(device).index
                tried.append(index)
                if index in ids:
                    raise RuntimeError("CUDA error: all CUDA-capable devices are busy or unavailable")
                return real(data)
            return real(data, device=device, **kwargs)

        monkeypatch.setattr(cuda_module.torch, "tensor", fake_tensor)
        return tried

    return set_busy


def test_all_usable(cuda_count, busy):
    cuda_count(3)
    tried = busy(set())
    assert find_usable_cuda_devices() == [0, 1, 2]
    assert find_usable_cuda_devices(2) == [0, 1]
    assert tried == [0, 1, 2, 0, 1]  # stops once enough are found


def test_busy_devices_are_skipped(cuda_count, busy):
    cuda_count(4)
    busy({0, 2})
    assert find_usable_cuda_devices(-1) == [1, 3]
    assert find_usable_cuda_devices(1) == [1]
    assert find_usable_cuda_devices(2) == [1, 3]


def test_too_few_usable(cuda_count, busy):
    cuda_count(3)
    busy({1})
    with pytest.raises(ConfigurationError) as info:
        find_usable_cuda_devices(3)
    text = str(info.value)
    assert "found only 2 usable of 3" in text and "[0, 2]" in text


def test_none_usable_for_all(cuda_count, busy):
    cuda_count(2)
    busy({0, 1})
    with pytest.raises(ConfigurationError, match="found only 0 usable of 2"):
        find_usable_cuda_devices(-1)


def test_more_than_visible(cuda_count, busy):
    cuda_count(2)
    tried = busy(set())
    with pytest.raises(ConfigurationError, match="asks for 5 devices, but only 2 are visible"):
        find_usable_cuda_devices(5)
    assert tried == []  # refused before touching any device


def test_no_cuda_here(cuda_count):
    cuda_count(0)
    with pytest.raises(ConfigurationError, match="no CUDA device"):
        find_usable_cuda_devices()


def test_zero_asks_for_nothing(cuda_count, busy):
    cuda_count(2)
    tried = busy(set())
    assert find_usable_cuda_devices(0) == []
    assert tried == []


@pytest.mark.parametrize("bad", [-2, 1.5, "2", True])
def test_bad_argument(cuda_count, bad):
    cuda_count(2)
    with pytest.raises(ConfigurationError, match="int >= 0, or -1"):
        find_usable_cuda_devices(bad)
