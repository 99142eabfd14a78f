"""Restarts after a failure, with real processes over gloo: our launchers (``max_restarts``) and torchrun's.

A rank that fails once (a marker file keeps it from failing again) makes every rank stop and start again;
the restarted run resumes from the newest complete checkpoint (ModelCheckpoint every 3 steps, the failure at
step 7) and ends with exactly the weights of an uninterrupted run. A rank that always fails is restarted
``max_restarts`` times, then the run fails as without restarts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.distributed.sharded_helpers import ROOT, child_env

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
SCRIPT = os.path.join(SCRIPTS, "restart_train.py")
TOTAL_STEPS = 8  # 2 epochs of 4 batches of 8 per rank


def run(cfg: dict, prefix: tuple[str, ...] = (), timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *prefix, SCRIPT, json.dumps(cfg)], capture_output=True, text=True,
                          timeout=timeout, env=child_env(**env), cwd=ROOT)


def starts(root, rank: int) -> list[str]:
    """The restart count each start of ``rank`` saw, in order."""
    return (root / f"starts-{rank}.txt").read_text().split("\n")[:-1]


@pytest.fixture(scope="module")
def reference(uninterrupted_ddp_run) -> dict:
    """The uninterrupted run: preempt_train.py's, the same model, data and shuffling as restart_train.py's without
    the checkpoints (tests/distributed/conftest.py: launched once, shared with test_preemption_ddp.py)."""
    assert uninterrupted_ddp_run["global_step"] == TOTAL_STEPS
    return uninterrupted_ddp_run


def _fails_once_then_matches(tmp_path, reference: dict, prefix: tuple[str, ...] = (), **cfg) -> str:
    cfg = {"root": str(tmp_path), "out": str(tmp_path / "out.pt"), "fail_rank": 1, "fail_step": 7,
           "marker": str(tmp_path / "failed-once"), **cfg}
    proc = run(cfg, prefix, **({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if prefix else {}))
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert (tmp_path / "failed-once").exists()  # it did fail
    # every rank started twice, the second time as restart 1; the checkpoint of step 6 was the newest
    assert starts(tmp_path, 0) == starts(tmp_path, 1) == ["start 0", "start 1"]
    assert f"resuming from {tmp_path / 'checkpoints' / 'epoch=1-step=6.ckpt'}" in proc.stderr
    result = torch.load(tmp_path / "out.pt")
    assert result["global_step"] == TOTAL_STEPS
    for name, want in reference["weights"].items():
        assert torch.equal(result["weights"][name], want), name
    return proc.stderr


@pytest.mark.parametrize("rank", [1, 0])
def test_ddp_rank_that_raises_once_is_restarted_and_ends_as_an_uninterrupted_run(tmp_path, reference, rank):
    # rank 1 is a re-run child; rank 0 is the launching process itself, which runs its command again
    stderr = _fails_once_then_matches(tmp_path, reference, strategy="ddp", max_restarts=1, fail_rank=rank)
    failed = "rank 1 failed (exit code 1):" if rank else "rank 0 raised"
    assert (f"torchfleet: {failed} ValueError: boom in rank {rank} at step 7; running the command again on all 2 "
            "ranks (restart 1 of 1).") in stderr


def test_ddp_spawn_rank_killed_is_restarted_and_ends_as_an_uninterrupted_run(tmp_path, reference):
    stderr = _fails_once_then_matches(tmp_path, reference, strategy="ddp_spawn", fail_how="kill", max_restarts=2)
    assert "torchfleet: rank 1 failed (killed by SIGKILL); starting all 2 ranks again (restart 1 of 2)." in stderr
    assert "restart 2 of 2" not in stderr


def test_a_hang_found_by_rank_0s_watchdog_restarts_the_group(tmp_path, reference):
    # rank 1 sleeps in training_step; rank 0, the launching process, waits in the gradient all-reduce until its
    # watchdog fires after hang_timeout: that is a failure like any other, so the group starts again
    stderr = _fails_once_then_matches(tmp_path, reference, strategy="ddp", fail_how="hang", hang_timeout=3,
                                      max_restarts=1)
    assert ("torchfleet: rank 0 failed (exit code 76): a hang between the ranks' collectives; running the command "
            "again on all 2 ranks (restart 1 of 1).") in stderr
    assert "Hang" in stderr  # the collectives report comes before that line


def test_torchrun_max_restarts_resumes_the_same_script(tmp_path, reference):
    # torchrun restarts the ranks itself and sets TORCHELASTIC_RESTART_COUNT, which auto_resume reads
    _fails_once_then_matches(tmp_path, reference, ("-m", "torch.distributed.run", "--standalone",
                                                   "--nproc-per-node=2", "--max-restarts=1"), strategy="ddp")


def test_a_rank_that_always_fails_fails_the_run_after_max_restarts(tmp_path):
    proc = run({"root": str(tmp_path), "out": str(tmp_path / "out.pt"), "fail_rank": 1, "fail_step": 1,
                "max_restarts": 2})
    assert proc.returncode != 0
    cause = "torchfleet: rank 1 failed (exit code 1): ValueError: boom in rank 1 at step 1"
    lines = [line for line in proc.stderr.splitlines() if line.startswith(cause)]
    assert lines == [f"{cause}; running the command again on all 2 ranks (restart 1 of 2).",
                     f"{cause}; running the command again on all 2 ranks (restart 2 of 2).",
                     f"{cause}; all 2 restart(s) used, so the run fails."], proc.stderr[-6000:]
    # then the same error as without restarts (raised in rank 0, or written by its watcher thread)
    assert "Rank 1 failed (exit code 1), so the other ranks were stopped" in proc.stderr
    assert starts(tmp_path, 0) == starts(tmp_path, 1) == ["start 0", "start 1", "start 2"]
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("started_by", ["python", "torchfleet run"])
def test_fleet_loop_restarts_and_resumes_itself(tmp_path, started_by):
    script = os.path.join(SCRIPTS, "fleet_restart.py")
    if started_by == "python":  # Fleet(strategy="ddp", max_restarts=1) re-runs the script
        command = [script, str(tmp_path)]
        again = "running the command again on all 2 ranks"
    else:
        command = ["-m", "torchfleet", "run", script, "--devices", "2", "--strategy", "ddp", "--accelerator", "cpu",
                   "--max-restarts", "1", "--", str(tmp_path), "run"]
        again = "starting all 2 processes again"
    proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=120, env=child_env(),
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-6000:]
    # rank 1 raised in the loop, outside any launch: it is still named, with its exception
    assert f"torchfleet: rank 1 failed (exit code 1): ValueError: boom in rank 1 at step 3; {again} (restart 1 of 1)." \
        in proc.stderr, proc.stderr[-6000:]
    # the restarted ranks saw restart_count 1, loaded the checkpoint of step 2 and ran steps 2..5
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank-{rank}.json").read_text()) == {
            "restart_count": 1, "start": 2, "ran": [2, 3, 4, 5]}
