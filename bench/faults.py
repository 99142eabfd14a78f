"""Faults: time from a rank's SIGKILL to every process gone, and from SIGTERM to the preemption checkpoint.

    python bench/faults.py [--repeats 3] [--hidden 256]

Kill: runs ``tests/distributed/scripts/fault_train.py`` (2 ranks, gloo, CPU, a ModelCheckpoint every
step) whose rank 1 (or rank 0) SIGKILLs itself at training step 4 after writing the time; the figure is
from that moment until no process carrying the run's token in its environment is left (the launching
process and every rank). SIGTERM: ``bench/preemption.py``'s measurement (SIGTERM to the launching
process after 20 steps, until ``preempted.ckpt`` is complete on disk; MLP 64-H-H-10), per strategy.
Hang: ``tests/distributed/scripts/hang_train.py`` (2 ranks, ``strategy="ddp"``) with ``case="sleep"`` (rank 1
sleeps in training_step while rank 0 waits in a barrier) and ``case="skip_log"`` (rank 1 skips one
``self.log(sync_dist=True)``: a desync), ``hang_timeout`` 5 s; the figure is from the moment the rank
diverges (it writes the time) until the launching process has exited with the report. A hang can only be
reported after ``hang_timeout``; a desync is found after min(2 s, hang_timeout/2) of waiting.
Watchdog cost: ``bench/ddp.py``'s tiny-model run (MLP 32-64-10, 2 ranks, 2000 steps) as ``ddp`` (watchdog on,
hang_timeout 300) and ``ddp_nowatch`` (hang_timeout=None), interleaved; steady-state steps/s and rank 0's
main-thread CPU time per step. Prints the median of the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
from preemption import one as sigterm_to_checkpoint  # noqa: E402
from tests.distributed.scripts.fault_train import processes_with  # noqa: E402
from tests.distributed.sharded_helpers import child_env  # noqa: E402

FAULT = os.path.join(ROOT, "tests", "distributed", "scripts", "fault_train.py")
HANG = os.path.join(ROOT, "tests", "distributed", "scripts", "hang_train.py")
HANG_TIMEOUT_S = 5


def kill_to_gone(strategy: str, rank: int) -> float:
    """Seconds from the rank's SIGKILL until every process of the run has exited."""
    root = tempfile.mkdtemp(prefix="tf-faults-bench-")
    token = f"bench-{strategy}-{time.time_ns()}"
    try:
        env = child_env(TF_FAULT_TOKEN=token, DS_ACCELERATOR="cpu")
        cfg = {"strategy": strategy, "phase": "train", "rank": rank, "root": root}
        proc = subprocess.Popen([sys.executable, FAULT, json.dumps(cfg)], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        killed = os.path.join(root, "killed")
        deadline = time.monotonic() + 300
        while not os.path.exists(killed):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{strategy}: no rank was killed:\n{proc.stderr.read()[-3000:]}")
            time.sleep(0.002)
        while proc.poll() is None or processes_with(token):
            time.sleep(0.002)
        gone = time.time()
        proc.stderr.read()
        return gone - float(open(killed).read())
    finally:
        shutil.rmtree(root, ignore_errors=True)


def divergence_to_report(case: str) -> tuple[float, str]:
    """Seconds from the moment rank 1 diverges (hang_train writes the time) until the run exited with its
    report, and the report's kind ("Hang" or "Desync")."""
    root = tempfile.mkdtemp(prefix="tf-hang-bench-")
    try:
        env = child_env()
        mark = os.path.join(root, "diverged")
        cfg = {"case": case, "hang_timeout": HANG_TIMEOUT_S, "mark": mark}
        proc = subprocess.run([sys.executable, HANG, json.dumps(cfg)], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        ended = time.time()
        kind = "Desync" if "Desync:" in proc.stderr else "Hang" if "Hang:" in proc.stderr else ""
        if proc.returncode == 0 or not kind or not os.path.exists(mark):
            raise RuntimeError(f"{case}: no report (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        return ended - float(open(mark).read()), kind
    finally:
        shutil.rmtree(root, ignore_errors=True)


def watchdog_cost(repeats: int) -> dict[str, dict[str, float]]:
    """bench/ddp.py's tiny model under ddp with and without the watchdog, interleaved: median steps/s and
    rank 0's main-thread CPU µs per step."""
    import ddp as ddp_bench

    cfg = dict(ddp_bench.SIZES["tiny"])
    work = tempfile.mkdtemp(prefix="tf-watchdog-bench-")
    runs: dict[str, list[dict]] = {"ddp": [], "ddp_nowatch": []}
    try:
        for rep in range(repeats):
            for variant in runs:
                runs[variant].append(ddp_bench.run_once(variant, cfg, work, f"{rep}-{variant}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {v: {"steps_per_s": statistics.median(r["steps_per_s"] for r in rs),
                "cpu_us": statistics.median(r["main_thread_cpu_us_per_step"] for r in rs)} for v, rs in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()
    import torch

    from torchfleet.checkpoint.deepspeed import deepspeed_available

    strategies = ["ddp", "ddp_spawn", "fsdp"] + (["deepspeed"] if deepspeed_available() else [])
    print(f"torch {torch.__version__}, {os.cpu_count()} CPU cores, 2 ranks (gloo), median of {args.repeats}")
    print(f"{'strategy':<12}{'SIGKILL rank 1 -> all gone s':>30}{'SIGKILL rank 0 -> all gone s':>30}"
          f"{'SIGTERM -> checkpoint s':>26}")
    for strategy in strategies:
        k1 = statistics.median(kill_to_gone(strategy, 1) for _ in range(args.repeats))
        k0 = statistics.median(kill_to_gone(strategy, 0) for _ in range(args.repeats))
        term = statistics.median(sigterm_to_checkpoint(strategy, 2, args.hidden)[0] for _ in range(args.repeats))
        print(f"{strategy:<12}{k1:>30.3f}{k0:>30.3f}{term:>26.3f}", flush=True)
    print(f"\nddp, hang_timeout={HANG_TIMEOUT_S} s: from the divergence to the launching process gone with the report")
    for case, what in (("sleep", "rank 1 asleep in its own code"), ("skip_log", "rank 1 skips a sync_dist log")):
        times, kinds = zip(*(divergence_to_report(case) for _ in range(args.repeats)))
        print(f"  {what:<34} {statistics.median(times):6.2f} s  ({'/'.join(sorted(set(kinds)))})", flush=True)
    cost = watchdog_cost(args.repeats)
    on, off = cost["ddp"], cost["ddp_nowatch"]
    print(f"\nwatchdog cost, tiny MLP under ddp, 2000 steps: steps/s {on['steps_per_s']:.1f} on vs "
          f"{off['steps_per_s']:.1f} off ({on['steps_per_s'] / off['steps_per_s']:.3f}x); rank 0 main-thread CPU "
          f"{on['cpu_us']:.0f} vs {off['cpu_us']:.0f} µs/step")


if __name__ == "__main__":
    main()
