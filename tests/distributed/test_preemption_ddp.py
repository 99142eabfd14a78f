"""Preemption across 2 real processes (gloo): a real signal to one rank stops every rank after the same step,
one checkpoint is saved, the run exits with code 75, and a restart (SLURM_RESTART_COUNT=1) resumes to
exactly the weights of an uninterrupted ddp run (torch.equal; fsdp within float rounding).

Strategies: ddp (signal to rank 0, to rank 1), ddp_spawn (SIGUSR1 to the launching process), fsdp (a DCP
directory), deepspeed ZeRO-2 (its own directory), and a Fleet loop."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from tests.distributed.test_ddp import ROOT
from torchfleet.checkpoint.deepspeed import deepspeed_available
from torchfleet.preemption import EXIT_CODE

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "preempt_train.py")
TOTAL_STEPS = 8  # 2 epochs of 4 batches of 8 per rank


def run(cfg: dict, restart: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    # the repository root (tests.*) before what the caller put on PYTHONPATH (a checkout's src, if any)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    for var in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK",
                "SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "TF_RESTART_COUNT"):
        env.pop(var, None)
    if restart:
        env["SLURM_RESTART_COUNT"] = "1"
    return subprocess.run([sys.executable, SCRIPT, json.dumps(cfg)], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def reference(uninterrupted_ddp_run) -> dict:
    """The uninterrupted run (tests/distributed/conftest.py: launched once, shared with test_restarts.py)."""
    assert uninterrupted_ddp_run["global_step"] == TOTAL_STEPS
    return uninterrupted_ddp_run


def _preempt_then_restart(tmp_path, cfg: dict, reference: dict, step: int, atol: float = 0.0,
                          sharded: bool = False) -> str:
    cfg = {**cfg, "root": str(tmp_path), "out": str(tmp_path / "out.pt"), "signal_step": step}
    proc = run(cfg)
    assert proc.returncode == EXIT_CODE, proc.stderr
    assert "Traceback" not in proc.stderr and "failed" not in proc.stderr, proc.stderr  # no rank reported as failing
    ckpt = tmp_path / "checkpoints" / "preempted.ckpt"
    # rank 0 says where it saved and how long after the signal reached it (when it did)
    found = re.search(rf"the checkpoint {re.escape(str(ckpt))} was saved at step \d+(, ([0-9.]+) s after the signal)?",
                      proc.stderr)
    assert found, proc.stderr
    assert found.group(2) is None or float(found.group(2)) < 10
    # complete and loadable; every rank stopped after the same step: after the signal, at the latest on the epoch's last
    # step (the ranks exchange their flags every few steps, and always on an epoch's last step), never before it
    assert os.path.isdir(ckpt) == sharded
    if sharded:  # a directory whose metadata file is written last
        saved = torch.load(ckpt / "torchfleet.pt", weights_only=True)
    else:
        saved = torch.load(ckpt, weights_only=True)
    epoch_end = (step // 4 + 1) * 4  # 4 steps per epoch
    assert step + 1 <= saved["global_step"] <= epoch_end, saved["global_step"]
    assert not os.path.exists(cfg["out"])
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["preempted.ckpt"]

    proc = run({**cfg, "signal_rank": -1}, restart=True)
    assert proc.returncode == 0, proc.stderr
    result = torch.load(cfg["out"])
    assert result["global_step"] == TOTAL_STEPS
    for name, want in reference["weights"].items():
        if atol:
            assert torch.allclose(result["weights"][name], want, rtol=0, atol=atol), name
        else:
            assert torch.equal(result["weights"][name], want), name
    return proc.stderr


@pytest.mark.parametrize("rank", [0, 1])
def test_ddp_signal_to_one_rank_saves_exits_75_and_resumes_exactly(tmp_path, reference, rank):
    stderr = _preempt_then_restart(tmp_path, {"strategy": "ddp", "signal_rank": rank}, reference, step=2)
    assert f"resuming from {tmp_path / 'checkpoints' / 'preempted.ckpt'}" in stderr


def test_ddp_spawn_launching_process_forwards_the_signal(tmp_path, reference):
    # SIGUSR1 (SLURM's --signal=USR1@90) to the process that only waits: it passes the signal to the ranks
    # and exits with code 75 when they have saved; the restart resumes bitwise
    _preempt_then_restart(tmp_path, {"strategy": "ddp_spawn", "signal_rank": 1, "signal_target": "parent",
                                     "signal": "SIGUSR1"}, reference, step=5)



def test_a_rank_that_fails_while_the_others_save_is_reported(tmp_path):
    proc = run({"strategy": "ddp", "root": str(tmp_path), "out": str(tmp_path / "o.pt"), "signal_rank": 0,
                "signal_step": 2, "die_in_save_rank": 1})
    assert proc.returncode not in (0, EXIT_CODE), proc.stderr
    assert "Rank 1 failed (exit code 3)" in proc.stderr
    ckpt = tmp_path / "checkpoints" / "preempted.ckpt"
    if ckpt.exists():  # rank 0 may have finished writing its file before it noticed: then it is complete
        assert torch.load(ckpt, weights_only=True)["global_step"] > 2


def test_fsdp_saves_a_sharded_checkpoint_and_resumes(tmp_path, reference):
    # the checkpoint is a DCP directory; fsdp's reductions differ from DDP's by float rounding only (a wrong RNG
    # or data position after the resume would differ by far more, through the dropout)
    _preempt_then_restart(tmp_path, {"strategy": "fsdp", "signal_rank": 1}, reference, step=4, atol=1e-5,
                          sharded=True)


@pytest.mark.skipif(not deepspeed_available(), reason="deepspeed is not installed (the 'deepspeed' extra)")
def test_deepspeed_saves_its_checkpoint_directory_and_resumes_exactly(tmp_path, reference, monkeypatch):
    # ZeRO-2 on CPU steps exactly as DDP here (measured: bitwise), so the ddp reference holds
    if not os.environ.get("TORCH_EXTENSIONS_DIR"):
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/torchfleet/torch_extensions"))
    _preempt_then_restart(tmp_path, {"strategy": "deepspeed_stage_2", "signal_rank": 1}, reference, step=4,
                          sharded=True)


def test_fleet_loop_sees_the_request_on_every_rank_after_the_same_step(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "scripts", "fleet_preempt.py")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    for var in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, script, "1", str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)
    assert proc.returncode == EXIT_CODE, proc.stderr
    assert "failed" not in proc.stderr, proc.stderr
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    signalled, every = ranks[1]["signalled"], ranks[1]["every"]
    # only rank 1 was signalled, after a step at which no rank started an exchange of the flags: both ranks
    # exchanged at the same steps, and both stopped after the same step, after the signal and within the agreed
    # steps between two exchanges plus the one that reads the exchange
    assert signalled is not None and signalled not in ranks[1]["polling"]
    assert ranks[0]["polling"] == ranks[1]["polling"]
    assert ranks[0]["stop"] == ranks[1]["stop"]
    assert signalled < ranks[0]["stop"] <= signalled + every + 1, (signalled, every, ranks[0]["stop"])
    assert torch.load(tmp_path / "preempted.ckpt", weights_only=True)["step"] == ranks[0]["stop"]
    # the exchanges are few: one every `every` steps once the ranks agreed on it (the first two steps exchange)
    assert every > 1
    assert ranks[0]["reductions"] == ranks[1]["reductions"] == len(ranks[0]["polling"])
    assert ranks[0]["reductions"] * 4 <= ranks[0]["stop"], ranks[0]
