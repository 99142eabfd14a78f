"""CPU, CUDA and MPS accelerators on a CPU machine: CUDA paths run against patched device counts."""

from __future__ import annotations

import pytest
import torch

from torchfleet.accelerators import Accelerator, CPUAccelerator, CUDAAccelerator, MPSAccelerator
from torchfleet.errors import ConfigurationError


def test_accelerator_is_abstract():
    with pytest.raises(TypeError):
        Accelerator()


def test_names():
    assert (CPUAccelerator.name, CUDAAccelerator.name, MPSAccelerator.name) == ("cpu", "cuda", "mps")


def test_cpu_accelerator():
    acc = CPUAccelerator()
    assert acc.is_available()
    assert acc.auto_device_count() == 1
    assert acc.parse_devices("auto") == 1
    assert acc.parse_devices(3) == 3
    assert acc.get_parallel_devices(3) == [torch.device("cpu")] * 3
    assert acc.get_parallel_devices("2") == [torch.device("cpu")] * 2
    try:  # as Lightning: psutil's figures, in percent; without psutil a clear error
        import psutil  # noqa: F401
    except ImportError:
        with pytest.raises(ModuleNotFoundError, match="pip install psutil"):
            acc.get_device_stats(torch.device("cpu"))
    else:
        stats = acc.get_device_stats(torch.device("cpu"))
        assert sorted(stats) == ["cpu_percent", "cpu_swap_percent", "cpu_vm_percent"]
        assert all(0 <= v <= 100 for v in stats.values())
    acc.setup_device(torch.device("cpu"))  # nothing to do, and must not fail
    acc.teardown()


@pytest.mark.parametrize("n", [0, 1, 4])
def test_cuda_count_is_read_at_call_time(cuda_count, n):
    cuda_count(n)
    assert CUDAAccelerator.auto_device_count() == n
    assert CUDAAccelerator.is_available() is (n > 0)


def test_cuda_devices_with_four_gpus(cuda_count):
    cuda_count(4)
    acc = CUDAAccelerator()
    assert acc.parse_devices(2) == [0, 1]
    assert acc.parse_devices("1, 3") == [1, 3]
    assert acc.parse_devices(-1) == [0, 1, 2, 3]
    assert acc.get_parallel_devices([1, 3]) == [torch.device("cuda", 1), torch.device("cuda", 3)]
    assert acc.get_parallel_devices("2,") == [torch.device("cuda", 2)]
    with pytest.raises(ConfigurationError, match="only 4 are visible"):
        acc.get_parallel_devices([4])  # unparsed lists are checked too


def test_cuda_devices_when_count_changes(cuda_count):
    acc = CUDAAccelerator()
    cuda_count(2)
    assert acc.parse_devices(-1) == [0, 1]
    cuda_count(3)  # nothing cached: the new count is seen
    assert acc.parse_devices(-1) == [0, 1, 2]
    cuda_count(0)
    with pytest.raises(ConfigurationError, match="none is visible"):
        acc.parse_devices(1)


def test_counting_never_initialises_cuda(cuda_count):
    cuda_count(4)
    acc = CUDAAccelerator()
    acc.is_available()
    acc.auto_device_count()
    acc.parse_devices("auto")
    acc.get_parallel_devices(2)
    assert acc.get_device_stats(torch.device("cuda", 0)) == {}  # no stats before CUDA was used
    assert not torch.cuda.is_initialized()


def test_counting_avoids_is_available_probe(monkeypatch):
    # torch.cuda.is_available() may start the CUDA driver (it breaks fork); with no device counted it is not asked
    def probe():
        raise AssertionError("is_available must not be called")

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", probe)
    assert not CUDAAccelerator.is_available()


def test_cuda_setup_device_sets_the_current_device(cuda_count, monkeypatch):
    cuda_count(2)
    seen = []
    monkeypatch.setattr(torch.cuda, "set_device", seen.append)
    CUDAAccelerator().setup_device(torch.device("cuda", 1))
    assert seen == [torch.device("cuda", 1)]
    with pytest.raises(ConfigurationError, match="drives cuda devices only"):
        CUDAAccelerator().setup_device(torch.device("cpu"))
    assert len(seen) == 1


def test_cuda_device_stats_come_from_memory_stats(monkeypatch):
    stats = {"allocated_bytes.all.current": 1024, "num_alloc_retries": 0}
    asked = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: asked.append(device) or dict(stats))
    out = CUDAAccelerator().get_device_stats(torch.device("cuda", 0))
    assert out == stats
    assert asked == [torch.device("cuda", 0)]


def test_cuda_teardown_empties_the_cache_only_after_use(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    CUDAAccelerator().teardown()
    assert calls == []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    CUDAAccelerator().teardown()
    assert calls == [1]


def test_mps_unavailable_here():
    if torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    assert not MPSAccelerator.is_available()
    assert MPSAccelerator.auto_device_count() == 0
    with pytest.raises(ConfigurationError, match="asks for mps devices, but none is visible"):
        MPSAccelerator.parse_devices(1)


def test_mps_when_available(mps):
    mps(True)
    assert MPSAccelerator.is_available()
    assert MPSAccelerator.auto_device_count() == 1
    assert MPSAccelerator.get_parallel_devices("auto") == [torch.device("mps", 0)]
    with pytest.raises(ConfigurationError, match="only 1 is visible"):
        MPSAccelerator.parse_devices(2)
