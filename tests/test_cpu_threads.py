"""CPU thread count per process: each rank gets max(1, usable cores // local processes) unless the user chose one.

Real processes: the script restricts its CPU affinity before torch starts (as taskset or a SLURM cpuset would),
then trains; each rank writes the thread count it trained with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "distributed", "scripts", "threads_report.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USABLE = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

needs_two_cores = pytest.mark.skipif(len(USABLE) < 2, reason="needs at least 2 usable CPU cores to tell counts apart")


def run(tmp_path, env_threads: str | None = None, **cfg) -> tuple[subprocess.CompletedProcess, dict[int, dict]]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
                        "NODE_RANK", "WORLD_SIZE", "RANK")}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "src")])
    if env_threads is not None:
        env["OMP_NUM_THREADS"] = env_threads
    proc = subprocess.run([sys.executable, SCRIPT, json.dumps({"out": str(tmp_path), **cfg})], capture_output=True,
                          text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in tmp_path.glob("rank-*.json")}
    return proc, reports


@needs_two_cores
def test_one_process_restricted_to_one_core_uses_one_thread(tmp_path):
    # torch's default counts the machine's cores, not the affinity mask: the Trainer corrects it
    proc, reports = run(tmp_path, strategy="single_device", affinity=USABLE[:1])
    assert reports == {0: {"threads": 1, "usable": 1}}
    assert "oversubscribe" not in proc.stderr


@needs_two_cores
def test_a_count_set_with_set_num_threads_is_kept(tmp_path):
    # one process on >= 2 cores would get every core; the user's 1 stays
    _, reports = run(tmp_path, strategy="single_device", set_threads=1)
    assert reports[0]["threads"] == 1


@needs_two_cores
def test_omp_num_threads_is_kept_and_oversubscription_warned(tmp_path):
    proc, reports = run(tmp_path, env_threads="2", strategy="single_device", affinity=USABLE[:1])
    assert reports[0]["threads"] == 2
    assert proc.stderr.count("oversubscribe") == 1
    assert "OMP_NUM_THREADS=2" in proc.stderr


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_two_ranks_share_the_cores(tmp_path, strategy):
    proc, reports = run(tmp_path, strategy=strategy, devices=2)
    expected = max(1, len(USABLE) // 2)
    assert reports == {0: {"threads": expected, "usable": len(USABLE)}, 1: {"threads": expected, "usable": len(USABLE)}}
    # 2 x 1 thread oversubscribes only a 1-core machine
    assert proc.stderr.count("oversubscribe") == (1 if 2 * expected > len(USABLE) else 0)


@pytest.mark.distributed
@pytest.mark.slow
def test_two_ranks_keep_omp_num_threads(tmp_path):
    # what torch itself makes of OMP_NUM_THREADS=2 in a fresh process (it caps the count at the cores)
    torch_count = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                     capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"},
                                     check=True).stdout)
    proc, reports = run(tmp_path, env_threads="2", strategy="ddp", devices=2)
    assert {r: v["threads"] for r, v in reports.items()} == {0: torch_count, 1: torch_count}
    # warned once for the machine (by local rank 0), not once per rank
    assert proc.stderr.count("oversubscribe") == (1 if 2 * torch_count > len(USABLE) else 0)
