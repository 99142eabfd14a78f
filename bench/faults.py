"""Faults: time from a rank's SIGKILL to every process gone, and from SIGTERM to the preemption checkpoint.

    python bench/faults.py [--repeats 3] [--hidden 256]

Kill: runs ``tests/distributed/scripts/fault_train.py`` (2 ranks, gloo, CPU, a ModelCheckpoint every
step) whose rank 1 (or rank 0) SIGKILLs itself at training step 4 after writing the time; the figure is
from that moment until no process carrying the run's token in its environment is left (the launching
process and every rank). SIGTERM: ``bench/preemption.py``'s measurement (SIGTERM to the launching
process after 20 steps, until ``preempted.ckpt`` is complete on disk; MLP 64-H-H-10), per strategy.
Prints the median of the repeats. The hang-to-report time and the watchdog's per-step overhead are
not measured here yet: those rows come with the hang watchdog (issue 12 item 4).
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

FAULT = os.path.join(ROOT, "tests", "distributed", "scripts", "fault_train.py")


def kill_to_gone(strategy: str, rank: int) -> float:
    """Seconds from the rank's SIGKILL until every process of the run has exited."""
    root = tempfile.mkdtemp(prefix="tf-faults-bench-")
    token = f"bench-{strategy}-{time.time_ns()}"
    try:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, TF_FAULT_TOKEN=token, DS_ACCELERATOR="cpu")
        for var in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
            env.pop(var, None)
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


if __name__ == "__main__":
    main()
