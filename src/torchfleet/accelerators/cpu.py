"""The CPU accelerator: ``devices=k`` means k processes on this machine's CPU."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from torchfleet.accelerators.base import Accelerator, AcceleratorName
from torchfleet.accelerators.devices import parse_cpu_processes

log = logging.getLogger("torchfleet")


def get_cpu_stats() -> dict[str, float]:
    """The machine's memory, CPU and swap use in percent (Lightning's keys), read with psutil."""
    try:
        import psutil
    except ImportError:
        raise ModuleNotFoundError("Fetching CPU device stats requires psutil, which is not installed here: "
                                  "pip install psutil.") from None
    return {"cpu_vm_percent": psutil.virtual_memory().percent, "cpu_percent": psutil.cpu_percent(),
            "cpu_swap_percent": psutil.swap_memory().percent}


class CPUAccelerator(Accelerator):
    """Train on the CPU; one process per requested device."""

    name = AcceleratorName("cpu")

    @staticmethod
    def parse_devices(devices: Any) -> int:
        """The number of processes (see ``parse_cpu_processes``: ``"auto"`` is 1, -1 and lists are refused)."""
        return parse_cpu_processes(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """``torch.device("cpu")`` once per process."""
        return [torch.device("cpu")] * parse_cpu_processes(devices)

    @staticmethod
    def auto_device_count() -> int:
        """One process: more CPU processes on one machine rarely train faster, so it is asked for explicitly."""
        return 1

    @staticmethod
    def is_available() -> bool:
        """Always true."""
        return True

    def get_device_stats(self, device: torch.device) -> dict[str, Any]:
        """The CPU's figures (``get_cpu_stats``: needs psutil), as Lightning's CPU accelerator reports them."""
        return get_cpu_stats()


# ---------------------------------------------------------------------------- threads per process
_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_applied: int | None = None  # the count this module set last (a second Trainer in the process sees it)
_warned = False


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask: what taskset, cgroups' cpusets or SLURM allow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def _physical_cores() -> int | None:
    """Physical cores of the machine (what torch counts for its default thread count), from sysfs on Linux."""
    root = "/sys/devices/system/cpu"
    try:
        cpus = [d for d in os.listdir(root) if d.startswith("cpu") and d[3:].isdigit()]
        cores = set()
        for cpu in cpus:
            path = os.path.join(root, cpu, "topology", "thread_siblings_list")
            if os.path.isfile(path):
                with open(path) as f:
                    cores.add(f.read().strip())
        return len(cores) or None
    except OSError:
        return None


def _looks_like_torch_default(threads: int) -> bool:
    # torch starts with one thread per physical core (MKL/OpenMP builds) or per logical CPU; a count that is
    # neither was set by the user (torch.set_num_threads) or by us earlier in this process
    return threads in {_physical_cores(), os.cpu_count(), usable_cores()}


def set_threads_per_process(local_processes: int, local_rank: int = 0) -> int:
    """Give this process its share of the CPU: ``max(1, usable cores // local processes)`` intra-op threads.

    Left alone when the user chose a count: ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` in the environment, or
    ``torch.set_num_threads(n)`` called with an ``n`` that is not torch's default. Several processes each
    running torch's default (one thread per core) fight over the cores: on a busy 2-core machine two ranks
    with 2 threads each ran 11x slower than with one. Warns once (on local rank 0) when the processes of
    this machine still ask for more threads than it has cores. Returns the thread count now in effect.
    """
    global _applied, _warned
    cores = usable_cores()
    target = max(1, cores // max(1, local_processes))
    current = torch.get_num_threads()
    user_set = any(os.environ.get(v) for v in _THREAD_ENV) or (
        current != _applied and not _looks_like_torch_default(current)
    )
    if not user_set and current != target:
        torch.set_num_threads(target)
        current = target
    _applied = current if not user_set else _applied
    if local_processes * current > cores and not _warned and local_rank == 0:
        _warned = True
        source = next((f"{v}={os.environ[v]}" for v in _THREAD_ENV if os.environ.get(v)), "torch.set_num_threads")
        log.warning(
            "%d processes x %d threads each (%s) on %d usable CPU cores: the processes oversubscribe the CPU "
            "and slow each other down. Use at most %d thread(s) per process (OMP_NUM_THREADS=%d), or fewer "
            "processes (devices=).", local_processes, current, source if user_set else "at least one each",
            cores, target, target,
        )
    return current
