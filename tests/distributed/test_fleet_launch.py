"""Fleet scripts whose processes were started from outside: torchrun's variables, and ``torchfleet run``.

``setup`` without ``launch`` must work there (the processes exist), and ``rank_zero_first`` must let
rank 1 into its block only after rank 0 has left it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.distributed.sharded_helpers import ROOT, child_env
from torchfleet.environments import find_free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fleet_started_outside.py")


def read_ranks(out_dir) -> list[dict]:
    return [json.loads((out_dir / f"rank-{r}.json").read_text()) for r in range(2)]


def check_ran_as_two_ddp_ranks(ranks: list[dict]) -> None:
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["world_size"] == 2 and r["strategy"] == "DDPStrategy" and r["device"] == "cpu"
        # rank r fed inputs r+1: DDP averaged the gradients of both ranks
        assert r["weight_grad"] == [[1.5, 1.5]]
    # has_len_all_ranks: both ranks have lengths; an empty loader on rank 1 alone is refused there unless allowed
    assert ranks[0]["len_all_ranks"] == [True, False, True]
    assert ranks[1]["len_all_ranks"] == [True, "This rank's list is empty", True]
    # rank_zero_first: rank 1 entered only after rank 0 had left (rank 0 stayed 1.5 s inside)
    assert ranks[0]["other_entered_meanwhile"] is False
    assert ranks[1]["rank0_had_left"] is True


def test_setup_without_launch_works_in_processes_torchrun_started(tmp_path):
    port = str(find_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, SCRIPT, "torchrun", str(tmp_path)], cwd=ROOT, stderr=subprocess.PIPE, text=True,
            env=child_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
        )
        for r in range(2)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(errors)[-6000:]
    check_ran_as_two_ddp_ranks(read_ranks(tmp_path))


def run_command(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchfleet", "run", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=child_env())


def test_torchfleet_run_starts_the_ranks_and_fleet_reads_its_options(tmp_path):
    proc = run_command(SCRIPT, "--devices", "2", "--strategy", "ddp", "--accelerator", "cpu",
                       "--precision", "bf16-mixed", "cli", str(tmp_path), "extra", "--", "--devices", "3")
    assert proc.returncode == 0, proc.stderr[-6000:]
    ranks = read_ranks(tmp_path)
    check_ran_as_two_ddp_ranks(ranks)  # Fleet() with no arguments: ddp over 2 CPU processes
    assert [r["precision"] for r in ranks] == ["bf16-mixed", "bf16-mixed"]
    # unknown arguments and everything after `--` reach the script, in order
    assert [r["argv"] for r in ranks] == [["extra", "--devices", "3"]] * 2


def test_torchfleet_run_reports_the_rank_that_failed_and_stops_the_others(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(
        "import time\nimport torchfleet as tf\n"
        "fleet = tf.Fleet()\nfleet.launch()\n"
        "if fleet.global_rank == 1:\n    raise RuntimeError('rank one gives up')\n"
        "time.sleep(600)\n"
    )
    proc = run_command(str(script), "--devices", "2", "--strategy", "ddp", "--accelerator", "cpu", timeout=60)
    assert proc.returncode != 0
    assert "Rank 1 failed" in proc.stderr and "rank one gives up" in proc.stderr
