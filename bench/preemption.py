"""Preemption: time from SIGTERM to the checkpoint on disk and to the process gone, on CPU.

    python bench/preemption.py [--repeats 3] [--hidden 2048]

Each run starts ``bench/_preempt_run.py`` (a Trainer training an MLP 64-H-H-10 with SGD + momentum
until stopped), waits until rank 0 has taken 20 steps, sends SIGTERM to the launching process
(rank 0 under ``ddp``; the process that only waits under ``ddp_spawn``) and measures, from the
moment the signal is sent: the preemption checkpoint appearing complete on disk (its atomic rename),
and the launching process exiting (its exit code must be 75). Variants: one process (tiny model
H=64, and H=--hidden), and 2 processes with ``ddp`` and ``ddp_spawn`` at H=--hidden. Prints the
median of the repeats and the checkpoint's size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "_preempt_run.py")


def one(strategy: str, devices: int, hidden: int) -> tuple[float, float, int]:
    root = tempfile.mkdtemp(prefix="tf-preempt-bench-")
    try:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        for var in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK",
                    "SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
            env.pop(var, None)
        proc = subprocess.Popen([sys.executable, RUN, strategy, str(devices), str(hidden), root], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        ready = os.path.join(root, "ready")
        deadline = time.monotonic() + 300
        while not os.path.exists(ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{strategy}: the run did not start:\n{proc.stderr.read()[-3000:]}")
            time.sleep(0.01)
        ckpt = os.path.join(root, "checkpoints", "preempted.ckpt")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        saved = None
        while proc.poll() is None:
            if saved is None and os.path.exists(ckpt):
                saved = time.monotonic()
            time.sleep(0.002)
        gone = time.monotonic()
        stderr = proc.stderr.read()
        if saved is None and os.path.exists(ckpt):
            saved = gone
        if proc.returncode != 75 or saved is None:
            raise RuntimeError(f"{strategy}: exit code {proc.returncode}, checkpoint {saved is not None}:\n{stderr[-3000:]}")
        return saved - sent, gone - sent, os.path.getsize(ckpt)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=2048)
    args = parser.parse_args()
    variants = [("single_device", 1, 64), ("single_device", 1, args.hidden), ("ddp", 2, args.hidden),
                ("ddp_spawn", 2, args.hidden)]
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPU cores, median of {args.repeats}")
    print(f"{'variant':<34}{'checkpoint MB':>14}{'SIGTERM -> on disk s':>22}{'SIGTERM -> exit 75 s':>22}")
    for strategy, devices, hidden in variants:
        runs = [one(strategy, devices, hidden) for _ in range(args.repeats)]
        name = f"{strategy} x{devices}, H={hidden}"
        print(f"{name:<34}{runs[0][2] / 2**20:>14.1f}{statistics.median(r[0] for r in runs):>22.3f}"
              f"{statistics.median(r[1] for r in runs):>22.3f}", flush=True)


if __name__ == "__main__":
    main()
