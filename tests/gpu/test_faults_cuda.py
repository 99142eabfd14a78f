"""Issue 12 under nccl: preemption, restarts and a killed rank with 2 CUDA ranks (the CPU/gloo versions are in
tests/distributed: test_preemption_ddp.py, test_restarts.py, test_fault_matrix.py, run with the same scripts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

from tests.distributed.scripts.fault_train import processes_with
from tests.distributed.sharded_helpers import ROOT, child_env
from tests.gpu.conftest import needs_cuda
from torchfleet.preemption import EXIT_CODE

SCRIPTS = os.path.join(ROOT, "tests", "distributed", "scripts")
TOTAL_STEPS = 8  # preempt_train / restart_train: 2 epochs of 4 batches of 8 per rank
#: reductions over nccl may round differently from one launch to the next; the CPU tests ask for torch.equal
ATOL = 1e-6


def run(script: str, cfg: dict, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, script), json.dumps(cfg)], capture_output=True,
                          text=True, timeout=timeout, env=child_env(**env), cwd=ROOT)


def reference(script: str, folder) -> dict:
    folder.mkdir()
    proc = run(script, {"accelerator": "cuda", "root": str(folder), "out": str(folder / "out.pt")})
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = torch.load(folder / "out.pt", map_location="cpu")
    assert result["global_step"] == TOTAL_STEPS
    return result


def reference_and_run(script: str, tmp_path) -> tuple[dict, object, dict]:
    """The uninterrupted run's result, the interrupted run's folder, and the config both share."""
    want = reference(script, tmp_path / "reference")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return want, run_dir, {"accelerator": "cuda", "strategy": "ddp", "root": str(run_dir), "out": str(run_dir / "out.pt")}


def assert_weights_close(got: dict, want: dict) -> None:
    for name, value in want.items():
        assert torch.allclose(got[name].cpu(), value.cpu(), rtol=0, atol=ATOL), name


@needs_cuda(2, "SIGTERM under nccl: one preempted.ckpt, exit code 75, a restart resumes to the uninterrupted weights")
def test_preemption_under_nccl_saves_exits_75_and_resumes(tmp_path):
    want, run_dir, cfg = reference_and_run("preempt_train.py", tmp_path)
    cfg.update(signal_step=3, signal_rank=1)
    proc = run("preempt_train.py", cfg)
    assert proc.returncode == EXIT_CODE, proc.stderr[-4000:]
    assert (run_dir / "checkpoints" / "preempted.ckpt").is_file()
    proc = run("preempt_train.py", {**cfg, "signal_rank": -1}, SLURM_RESTART_COUNT="1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = torch.load(run_dir / "out.pt", map_location="cpu")
    assert result["global_step"] == TOTAL_STEPS
    assert_weights_close(result["weights"], want["weights"])


@needs_cuda(2, "max_restarts under nccl: a rank that raises once is restarted and the run ends as an uninterrupted one")
def test_restart_under_nccl_ends_as_an_uninterrupted_run(tmp_path):
    want, run_dir, cfg = reference_and_run("restart_train.py", tmp_path)
    cfg.update(fail_rank=1, fail_step=7, marker=str(run_dir / "failed-once"), max_restarts=1)
    proc = run("restart_train.py", cfg)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "(restart 1 of 1)" in proc.stderr
    result = torch.load(run_dir / "out.pt", map_location="cpu")
    assert result["global_step"] == TOTAL_STEPS
    assert_weights_close(result["weights"], want["weights"])


@needs_cuda(2, "a rank SIGKILLed during an nccl run: every process gone within 5 s, the rank named")
def test_a_killed_cuda_rank_stops_every_process(tmp_path):
    token = f"cuda-kill-{os.getpid()}-{time.time_ns()}"
    cfg = {"accelerator": "cuda", "strategy": "ddp", "phase": "train", "rank": 1, "root": str(tmp_path)}
    proc = run("fault_train.py", cfg, TF_FAULT_TOKEN=token)
    assert proc.returncode != 0
    assert "Rank 1 failed (killed by SIGKILL)" in proc.stderr, proc.stderr[-4000:]
    killed_at = float((tmp_path / "killed").read_text())
    deadline = killed_at + 5.0
    while processes_with(token) and time.time() < deadline:
        time.sleep(0.05)
    assert not processes_with(token), "processes left behind 5 s after the kill"
