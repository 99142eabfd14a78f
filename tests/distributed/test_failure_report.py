"""A rank that raises is reported once: its own traceback, the rank, no echo from the other ranks.

Each case runs ``scripts/failing_rank.py`` as a user runs a program (2 ranks over gloo on the CPU), whose training
step raises ValueError on one rank, and reads everything the run printed (stdout and stderr together).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests.distributed.scripts.fault_train import processes_with
from tests.distributed.sharded_helpers import child_env

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "distributed", "scripts", "failing_rank.py")


def run_failing(cfg: dict) -> str:
    """Run the program; what it printed, after checking that it failed and left no process behind."""
    token = uuid.uuid4().hex
    proc = subprocess.run([sys.executable, SCRIPT, json.dumps(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=180, env=child_env(TF_FAULT_TOKEN=token), cwd=ROOT)
    assert proc.returncode != 0, proc.stdout
    assert processes_with(token) == []
    return proc.stdout


@pytest.mark.parametrize(("api", "strategy", "fleet_fn"), [
    ("trainer", "ddp", False), ("trainer", "ddp_spawn", False), ("trainer", "fsdp", False),
    ("fleet", "ddp", False), ("fleet", "ddp_spawn", True), ("fleet", "fsdp", False),
])
def test_a_failing_rank_is_reported_once(api, strategy, fleet_fn):
    out = run_failing({"api": api, "strategy": strategy, "fail_rank": 1, "fleet_fn": fleet_fn})
    lines = out.strip().splitlines()
    assert out.count("ValueError: boom in rank 1 at batch 1") == 1, out  # the original error, once
    assert "Rank 1 failed" in out, out  # the rank that failed is named
    assert out.count('raise ValueError(f"boom in rank {rank} at batch {batch_idx}")') == 1, out  # its traceback
    # no echo of the other rank's broken connection, and no traceback but the failing rank's: not the launching
    # process's frames that raised the report (they were a second traceback around the first, 27 lines in all)
    assert "Connection closed" not in out and "Connection reset" not in out, out
    assert out.count("Traceback (most recent call last)") == 1, out
    assert "[rank0]" not in out and "script.py" not in out and "processes.py" not in out, out
    assert len(lines) <= 15, out


def test_rank_0_failing_in_a_fleet_loop_stops_the_others():
    # the loop runs outside any launch: rank 0's own error is Python's to print; rank 1, left waiting in a
    # collective, must be stopped at once (not when the watchdog's hang_timeout ends) and say nothing
    out = run_failing({"api": "fleet", "strategy": "ddp", "fail_rank": 0})
    assert out.count("ValueError: boom in rank 0 at batch 1") == 1, out
    assert "Rank 1 failed" not in out and "Connection closed" not in out, out
    assert out.count("Traceback (most recent call last)") == 1, out
