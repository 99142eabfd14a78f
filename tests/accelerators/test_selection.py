"""accelerator= names: auto/gpu choice for 0, 1 and 4 CUDA devices, MPS, custom and unknown names."""

from __future__ import annotations

import pytest
import torch

from torchfleet.accelerators import (
    AcceleratorRegistry,
    CPUAccelerator,
    CUDAAccelerator,
    MPSAccelerator,
    select_accelerator,
)
from torchfleet.errors import ConfigurationError


def test_builtins_registered():
    assert {"cpu", "cuda", "mps"} <= set(AcceleratorRegistry.available())
    assert AcceleratorRegistry.entry("cuda").cls is CUDAAccelerator


@pytest.mark.parametrize("n", [1, 4])
def test_auto_and_gpu_take_cuda_when_present(cuda_count, mps, n):
    cuda_count(n)
    mps(True)  # CUDA is preferred even where MPS would answer too
    assert type(select_accelerator("auto")) is CUDAAccelerator
    assert type(select_accelerator("gpu")) is CUDAAccelerator
    assert type(select_accelerator("cuda")) is CUDAAccelerator
    assert select_accelerator("auto").auto_device_count() == n


def test_no_gpu(cuda_count, mps):
    cuda_count(0)
    assert type(select_accelerator("auto")) is CPUAccelerator
    assert type(select_accelerator()) is CPUAccelerator
    with pytest.raises(ConfigurationError) as info:
        select_accelerator("gpu")
    assert "no GPU is available" in str(info.value) and "accelerator='cpu'" in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        select_accelerator("cuda")
    text = str(info.value)
    assert "cuda is not available" in text and "accelerator='cpu'" in text and "'auto'" in text
    assert not torch.cuda.is_initialized()


def test_mps_chosen_without_cuda(cuda_count, mps):
    cuda_count(0)
    mps(True)
    assert type(select_accelerator("auto")) is MPSAccelerator
    assert type(select_accelerator("gpu")) is MPSAccelerator
    assert type(select_accelerator("mps")) is MPSAccelerator


def test_mps_refused_here(mps):
    mps(False)
    with pytest.raises(ConfigurationError, match="mps is not available"):
        select_accelerator("mps")


def test_names_are_case_and_space_tolerant(cuda_count):
    cuda_count(1)
    assert type(select_accelerator("CPU")) is CPUAccelerator
    assert type(select_accelerator(" Cuda ")) is CUDAAccelerator
    assert type(select_accelerator("GPU")) is CUDAAccelerator


def test_instance_returned_as_is(cuda_count):
    cuda_count(1)
    acc = CUDAAccelerator()
    assert select_accelerator(acc) is acc


def test_instance_whose_devices_are_missing_is_refused(cuda_count):
    """As Lightning's Trainer: an Accelerator object is asked is_available() too."""
    cuda_count(0)
    with pytest.raises(ConfigurationError, match=r"CUDAAccelerator\(\) was given, but its is_available\(\) returned "
                                                 r"False: cuda devices are not available here"):
        select_accelerator(CUDAAccelerator())


def test_class_instead_of_instance():
    with pytest.raises(ConfigurationError, match=r"pass an instance, accelerator=CPUAccelerator\(\)"):
        select_accelerator(CPUAccelerator)


@pytest.mark.parametrize("given, closest", [("cdua", "cuda"), ("cpus", "cpu"), ("mpss", "mps"), ("atuo", "auto")])
def test_unknown_name_suggests_closest(given, closest):
    with pytest.raises(ConfigurationError) as info:
        select_accelerator(given)
    text = str(info.value)
    assert f"Did you mean '{closest}'" in text
    assert repr(given) in text and "'gpu'" in text  # what was given, and every accepted name


def test_unknown_type():
    with pytest.raises(ConfigurationError, match="not understood"):
        select_accelerator(3)


class _Fancy(CPUAccelerator):
    """A CPU with another name, as a third-party accelerator would be."""

    name = "fancy"

    def __init__(self, level: int = 0) -> None:
        self.level = level


class _Missing(CPUAccelerator):
    name = "missing"

    @staticmethod
    def is_available() -> bool:
        return False


@pytest.fixture
def registered():
    names: list[str] = []

    def register(name, cls, **kwargs):
        AcceleratorRegistry.register(name, cls, **kwargs)
        names.append(name)

    yield register
    for name in names:
        AcceleratorRegistry.remove(name)


def test_custom_accelerator_by_name(registered):
    registered("fancy", _Fancy, description="a renamed CPU")
    registered("fancy_max", _Fancy, level=3)
    a, b = select_accelerator("fancy"), select_accelerator("fancy")
    assert type(a) is _Fancy and a is not b  # a fresh instance per lookup
    assert a.level == 0 and select_accelerator("fancy_max").level == 3
    assert {"fancy", "fancy_max"} <= set(AcceleratorRegistry.available_accelerators())
    with pytest.raises(ConfigurationError, match="Did you mean 'fancy'"):
        select_accelerator("fancyy")


def test_custom_accelerator_with_uppercase_name(registered):
    registered("MyChip", _Fancy)
    assert type(select_accelerator("MyChip")) is _Fancy


def test_custom_accelerator_unavailable(registered):
    registered("missing", _Missing)
    with pytest.raises(ConfigurationError, match="missing is not available"):
        select_accelerator("missing")


def test_registry_refuses_non_accelerators_and_duplicates(registered):
    with pytest.raises(ConfigurationError, match="subclass of Accelerator"):
        AcceleratorRegistry.register("bad", int)
    with pytest.raises(ConfigurationError, match="already registered"):
        AcceleratorRegistry.register("cpu", _Fancy)
    assert AcceleratorRegistry.entry("cpu").cls is CPUAccelerator
