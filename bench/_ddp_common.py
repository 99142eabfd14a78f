"""What bench/_ddp_raw.py and bench/_ddp_fleet.py share: arguments, model, data and the rank-0 clock.

Not a benchmark by itself: bench/ddp.py starts those two scripts. Both train the same MLP on the
same data (2 ranks, DistributedSampler seeded 0 and shuffled, SGD, mean cross-entropy) with one
torch thread per process, and global rank 0 writes ``--out`` (JSON) when training ends:

* ``steps_per_s``: the steps after the warm-up divided by the time they took, read with
  time.perf_counter at the end of every step (in the loop for raw, in a callback's
  ``on_train_batch_end`` for torchfleet); ``steps_per_s_windowed``: the rate of the median
  window when those steps are cut in ~50 windows (robust to the machine stalling a process);
* ``marks``: wall-clock seconds (time.time) since ``BENCH_T0``, the time the driver took just
  before it started the command: ``imported`` (the script the user runs finished its imports),
  ``process_group`` (rank 0 joined the process group), ``ddp_ready`` (model wrapped in DDP,
  optimizer made), ``first_step`` (rank 0's first training step begins);
* ``cpu_us_per_step``, ``main_thread_cpu_us_per_step``: rank 0's CPU time per steady step, the
  whole process (gloo's threads too) and the main thread;
* ``checksum``: the sum of rank 0's parameters after training, equal across variants when they
  trained alike.

Diagnostics: ``--cprofile FILE`` profiles rank 0 from the end of the warm-up to the last step
(its throughput is then no result: the profiler slows Python down); ``--timers`` adds the mean µs
per step of the pieces of a step (``timers_us``) and the CPU seconds of each of rank 0's threads
(``thread_cpu_s``) to the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch
from torch import nn


def parse_args(variants: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variant", choices=variants)
    parser.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")], required=True)
    parser.add_argument("--batch", type=int, required=True, help="per process")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--batches-per-epoch", type=int, default=500, help="per process")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--out", required=True, help="JSON result, written by global rank 0")
    parser.add_argument("--cprofile", default="", help="dump cProfile stats of rank 0's steady steps here")
    parser.add_argument("--timers", action="store_true", help="time the pieces of each step")
    args = parser.parse_args()
    os.environ.setdefault("BENCH_T0", repr(time.time()))  # run by hand: count from here
    return args


def mlp(widths: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def dataset(widths: list[int], batch: int, batches_per_epoch: int, world: int) -> torch.utils.data.TensorDataset:
    """The same tensors in every process and variant: ``batches_per_epoch`` batches per rank."""
    n = batches_per_epoch * batch * world
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, widths[0], generator=g)
    y = torch.randint(0, widths[-1], (n,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def since_launch(t: float) -> float:
    return t - float(os.environ["BENCH_T0"])


def windowed_rate(ends: list[float], windows: int = 50) -> float:
    """Steps/s of the median window: the steady steps cut in ~``windows`` windows of equal step count.

    Robust to stalls of the machine (a process descheduled for a while): those slow a few windows,
    not the median. One window per step when there are fewer steps than ``windows``.
    """
    size = max(1, (len(ends) - 1) // windows)
    rates = [size / (ends[i + size] - ends[i]) for i in range(0, len(ends) - size, size)]
    rates.sort()
    return rates[len(rates) // 2] if rates else float("nan")


def thread_cpu() -> dict[str, float]:
    """CPU seconds used so far by each thread of this process, by thread name (Linux /proc; {} elsewhere)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            key = name if name not in out else f"{name}#{tid}"
            out[key] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    except OSError:
        return {}
    return out


class Clock:
    """Rank 0's launch marks and steady-state step clock; ``finish`` writes the JSON result."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.warmup, self.n, self.t_warm, self.t_last = args.warmup, 0, 0.0, 0.0
        self.ends: list[float] = []  # perf_counter at the end of each steady step
        self.cpu_warm = self.cpu_last = (0.0, 0.0)  # (process, main thread) CPU time
        self.started = False
        self.marks: dict[str, float] = {}
        self.profiler: Any = None
        self.timers: dict[str, float] | None = {} if args.timers else None

    def mark(self, name: str) -> None:
        self.marks[name] = since_launch(time.time())

    def step_start(self) -> None:
        if not self.started:
            self.started = True
            self.mark("first_step")

    def step_end(self) -> None:
        self.n += 1
        if self.n == self.warmup:
            self.cpu_warm = (time.process_time(), time.thread_time())
            self.t_warm = time.perf_counter()
            if self.profiler is not None:
                self.profiler.enable()
        self.t_last = t = time.perf_counter()
        if self.n >= self.warmup:
            self.ends.append(t)
            if self.n == self.args.steps:
                self.cpu_last = (time.process_time(), time.thread_time())

    def add(self, name: str, seconds: float) -> None:
        timers = self.timers
        if timers is not None and self.n >= self.warmup:
            timers[name] = timers.get(name, 0.0) + seconds

    def start_profiler(self, rank: int) -> None:
        if self.args.cprofile and rank == 0:
            import cProfile

            self.profiler = cProfile.Profile()

    def finish(self, rank: int, model: nn.Module, loss: float) -> None:
        if self.profiler is not None:
            self.profiler.disable()
        if rank != 0:
            return
        if self.profiler is not None:
            self.profiler.dump_stats(self.args.cprofile)
        steady = self.n - self.warmup
        with torch.no_grad():
            checksum = float(sum(p.double().sum() for p in model.parameters()))
        result = {
            "variant": self.args.variant,
            "steps": self.n,
            "steady_steps": steady,
            "steps_per_s": steady / (self.t_last - self.t_warm) if steady > 0 else float("nan"),
            "steps_per_s_windowed": windowed_rate(self.ends),
            "marks": self.marks,
            # rank 0's CPU time per steady step: the whole process (gloo's threads too) and the main thread
            "cpu_us_per_step": (self.cpu_last[0] - self.cpu_warm[0]) / max(steady, 1) * 1e6,
            "main_thread_cpu_us_per_step": (self.cpu_last[1] - self.cpu_warm[1]) / max(steady, 1) * 1e6,
            "checksum": checksum,
            "final_loss": loss,
            "threads": torch.get_num_threads(),
            "world_size": torch.distributed.get_world_size(),
        }
        if self.timers is not None:
            result["timers_us"] = {k: v / max(steady, 1) * 1e6 for k, v in self.timers.items()}
            result["thread_cpu_s"] = thread_cpu()
        tmp = self.args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, self.args.out)
