"""Tests marked ``forks`` start ddp_fork ranks from the test process itself.

On a machine with a GPU, the first backward pass in a process (on any device) starts autograd's
device threads, and PyTorch then refuses backward in every process forked from it; torchfleet
refuses such a fork up front. By the time these tests run, earlier tests have trained in the
pytest process, so there each of them runs in a fresh interpreter (``python -m pytest NODEID``),
as a notebook that calls ``trainer.fit`` first would. On a CPU-only machine (CI) no device threads
start and they run in place. ``TF_TEST_FRESH_FORK=1`` forces the fresh interpreter anywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_CHILD = "TF_TEST_IN_FRESH_INTERPRETER"
_FORCE = "TF_TEST_FRESH_FORK"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if pyfuncitem.get_closest_marker("forks") is None or os.environ.get(_CHILD):
        return None
    from torchfleet.launchers.processes import autograd_device_threads

    if not (autograd_device_threads() or os.environ.get(_FORCE)):
        return None
    env = {**os.environ, _CHILD: "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=--import-mode=importlib",
         pyfuncitem.nodeid],
        cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(f"{pyfuncitem.nodeid} failed in a fresh interpreter:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")
    if " passed" not in proc.stdout:
        pytest.fail(f"{pyfuncitem.nodeid} ran no test in a fresh interpreter:\n{proc.stdout[-3000:]}")
    return True


@pytest.fixture(scope="session")
def uninterrupted_ddp_run(tmp_path_factory) -> dict:
    """``scripts/preempt_train.py`` on 2 ddp ranks, never stopped: its final weights and global step.

    The one reference of test_preemption_ddp.py and test_restarts.py (restart_train.py trains the same seeded model
    on the same data with the same shuffling; its checkpoints do not change the run), launched once per session."""
    import json

    import torch

    from tests.distributed.sharded_helpers import ROOT, child_env

    folder = tmp_path_factory.mktemp("uninterrupted")
    env = child_env()
    for var in ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "TF_RESTART_COUNT"):
        env.pop(var, None)
    script = os.path.join(ROOT, "tests", "distributed", "scripts", "preempt_train.py")
    cfg = {"strategy": "ddp", "root": str(folder), "out": str(folder / "out.pt")}
    proc = subprocess.run([sys.executable, script, json.dumps(cfg)], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = torch.load(folder / "out.pt")
    assert result["global_step"] == 8  # 2 epochs of 4 batches of 8 per rank
    return result
