"""Issue 32 item 6: every failure is one report (real processes over gloo, real files, CPU).

Each case runs ``scripts/report_faults.py`` as a user runs a program and reads everything it printed: how many
tracebacks and lines, the exit code, the words the OS used and the path, the rank that was lost. The failing rank's
own traceback in the launching process's output, and a hang or desync's exit code, are in test_failure_report.py and
test_sharded_after_fit.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.distributed.scripts.fault_train import processes_with
from torchfleet.checkpoint.consolidate import read_full_checkpoint
from torchfleet.errors import CheckpointError

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "distributed", "scripts", "report_faults.py")


def run(cfg: dict) -> tuple[int, str]:
    """Run the program to its end (exit code, stdout and stderr together), after checking no process is left."""
    token = f"report-{os.getpid()}-{time.time_ns()}"
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, TF_FAULT_TOKEN=token)
    for var in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, SCRIPT, json.dumps(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=240, env=env, cwd=ROOT)
    deadline = time.monotonic() + 10
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(token) == [], proc.stdout
    return proc.returncode, proc.stdout


@pytest.mark.parametrize("mesh", [{"strategy": "fsdp"}, {"strategy": "model_parallel", "tp": 2, "dp": 1}],
                         ids=["fsdp", "tensor_parallel"])
def test_a_file_size_limit_during_a_sharded_save_is_one_paragraph_and_the_last_checkpoint_survives(tmp_path, mesh):
    # every rank may write 20 kB per file; a shard of this model (width 1024, AdamW) is over 100 kB
    code, out = run({"case": "fsize", "devices": 2, "root": str(tmp_path), "limit": 20_000, "hidden": 1024, **mesh})
    path = str(tmp_path / "ckpt" / "last.ckpt")
    assert code == 1, out
    assert out.count("File too large") == 1 and f"Saving the checkpoint '{path}' failed" in out, out
    assert "CheckpointException" not in out and "(RANK 1)" not in out and "[rank0]" not in out, out
    assert out.count("Traceback (most recent call last)") == 1, out  # was one per rank, inside DCP's exception
    assert len(out.splitlines()) <= 25, out  # was 107 (fsdp) and 159 (tensor parallel) lines
    # the save that failed left the one before it (after step 1) whole, and no partial directory behind
    assert read_full_checkpoint(path, with_optimizer=False)["global_step"] == 1
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["last.ckpt"]
    # a shard cut short, read in one process: the error names the file, not only the directory
    shard = next(os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".distcp"))
    with open(shard, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(CheckpointError, match="is damaged") as info:  # the save's record of each file's size
        read_full_checkpoint(path)
    assert f"{shard} holds 1000 bytes" in str(info.value)
    assert "weights_only" not in str(info.value)


def test_rank_0_killed_under_tensor_parallel_is_named_once_without_tracebacks(tmp_path):
    # TP2 x DP2: rank 0 is the launching process; its three children lose their connections to it at once
    code, out = run({"case": "kill", "rank": 0, "strategy": "model_parallel", "tp": 2, "dp": 2, "devices": 4,
                     "root": str(tmp_path)})
    assert code == -9, out
    assert out.count("torchfleet: rank 0, the launching process") == 1, out
    assert "killed" in out.split("torchfleet: rank 0, the launching process")[1], out
    # was 124-191 lines of gloo tracebacks, rank 0 named in 1 run of 3, once a FileNotFoundError of our own
    assert "Traceback" not in out and "FileNotFoundError" not in out and "gloo" not in out.lower(), out
    assert len(out.splitlines()) <= 10, out
