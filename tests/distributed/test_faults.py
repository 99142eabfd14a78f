"""Faults in multi-process runs: a rank that raises or dies stops every rank, never a hang.

Each run would wait 30 minutes (the process-group timeout) if the other ranks were left
waiting in a collective; finishing in seconds with the failing rank named is the behaviour
under test.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import time

import pytest
import torch

import torchfleet as tf
from tests.distributed.scripts.ddp_train import build
from tests.distributed.test_ddp import run_script
from torchfleet.errors import ConfigurationError
from torchfleet.launchers import ProcessFailedError

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _processes_mentioning(token: str) -> list[int]:
    """PIDs of live processes whose command line contains ``token`` (the run's unique output path)."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize("fail_rank", [0, 1])
def test_a_rank_that_raises_stops_every_rank_and_is_named(tmp_path, fail_rank):
    out = str(tmp_path / "never-written.pt")
    start = time.monotonic()
    proc = run_script({"strategy": "ddp", "devices": 2, "fail_rank": fail_rank, "out": out}, timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert f"boom in rank {fail_rank}" in proc.stderr
    if fail_rank == 1:
        assert "Rank 1 failed" in proc.stderr
    else:  # rank 1's "connection closed" is an echo of rank 0's error, not the cause
        assert "Rank 1 failed" not in proc.stderr
    assert elapsed < 30, f"took {elapsed:.1f}s: the other rank waited instead of stopping"
    assert _processes_mentioning(out) == []  # no rank left behind
    assert not os.path.exists(out)


def test_a_rank_killed_by_a_signal_stops_the_run(tmp_path):
    out = str(tmp_path / "never-written.pt")
    proc = run_script({"strategy": "ddp", "devices": 2, "fail_rank": 1, "fail_how": "kill", "out": out}, timeout=60)
    assert proc.returncode != 0
    assert "Rank 1 failed (killed by SIGKILL)" in proc.stderr
    assert _processes_mentioning(out) == []


@pytest.mark.parametrize("strategy", ["ddp_spawn", pytest.param("ddp_fork", marks=pytest.mark.forks)])
def test_spawned_rank_failure_raises_in_the_parent_with_rank_and_message(strategy):
    tf.seed_everything(0)
    model, trainer, train, val = build({"strategy": strategy, "devices": 2, "fail_rank": 1})
    start = time.monotonic()
    with pytest.raises(ProcessFailedError, match="Rank 1 failed") as info:
        trainer.fit(model, train, val)
    assert time.monotonic() - start < 30
    assert info.value.rank == 1
    assert "ValueError: boom in rank 1 at step 1" in str(info.value)


@pytest.mark.forks
def test_spawned_rank_killed_is_reported_with_the_signal():
    tf.seed_everything(0)
    model, trainer, train, val = build({"strategy": "ddp_fork", "devices": 2, "fail_rank": 0, "fail_how": "kill"})
    with pytest.raises(ProcessFailedError, match=r"Rank 0 failed \(killed by SIGKILL\)"):
        trainer.fit(model, train, val)


class _Augmented(torch.nn.Module):
    """Holds a lambda, as users do for quick augmentations: spawn cannot pickle it."""


def test_unpicklable_model_under_spawn_names_the_attribute_before_starting():
    tf.seed_everything(0)
    model, trainer, train, val = build({"strategy": "ddp_spawn", "devices": 2})
    model.augment = lambda x: x + 1
    with pytest.raises(ConfigurationError) as info:
        trainer.fit(model, train, val)
    text = str(info.value)
    assert "model.augment -> <lambda>" in text
    assert "'ddp'" in text and "'ddp_fork'" in text


def test_fork_after_cuda_initialisation_is_refused(monkeypatch):
    # the device state is patched (this machine has no GPU); the refusal logic is what is tested
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    model, trainer, train, val = build({"strategy": "ddp_fork", "devices": 2})
    with pytest.raises(ConfigurationError, match="CUDA was already initialised"):
        trainer.fit(model, train, val)


def test_a_port_already_in_use_is_refused_before_starting(tmp_path):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_script({"strategy": "ddp", "devices": 2, "out": str(tmp_path / "x.pt")}, timeout=60,
                          env={"MASTER_PORT": str(port)})
        assert proc.returncode != 0
        assert f"MASTER_PORT={port} is already in use" in proc.stderr
        model, trainer, train, val = build({"strategy": "ddp_spawn", "devices": 2})
        os.environ["MASTER_PORT"] = str(port)
        try:
            with pytest.raises(ConfigurationError, match=f"MASTER_PORT={port} is already in use"):
                trainer.fit(model, train, val)
        finally:
            del os.environ["MASTER_PORT"]


def test_world_size_from_the_launcher_must_match_devices_times_nodes(monkeypatch):
    from torchfleet.connector import resolve

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    # the check runs where Lightning's launcher runs it: when the stage launches, before any process group
    strategy = resolve(accelerator="cpu", devices=1, strategy="ddp")
    with pytest.raises(ConfigurationError) as info:
        strategy.launcher.launch(lambda: None)
    assert "4" in str(info.value) and "devices=1" in str(info.value)
    # strategy='auto' must not quietly train 4 unsynchronised copies: it picks ddp, which checks
    strategy = resolve(accelerator="cpu", devices=1)
    with pytest.raises(ConfigurationError, match="WORLD_SIZE=4"):
        strategy.launcher.launch(lambda: None)


def test_ctrl_c_in_the_launching_process_saves_and_stops_every_rank(tmp_path):
    import json
    import subprocess
    import sys

    from tests.distributed.test_ddp import ROOT, SCRIPT
    from tests.distributed.test_fault_matrix import default_sigint

    out = str(tmp_path / "never-written.pt")
    started_read, started_write = os.pipe()
    cfg = {"strategy": "ddp", "devices": 2, "epochs": 10_000, "started_fd": started_write, "out": out}
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    # in tmp_path: the run saves its preemption checkpoint under the working directory (no default_root_dir)
    proc = subprocess.Popen([sys.executable, SCRIPT, json.dumps(cfg)], stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path, pass_fds=(started_write,), preexec_fn=default_sigint)
    os.close(started_write)  # the script holds the only write end: its exit ends the wait too
    try:
        # blocks until rank 0 has trained two steps (or the script died: end of file)
        ready, _, _ = select.select([started_read], [], [], 60)
        assert ready and os.read(started_read, 1) == b"1", "training did not start"
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the launching process
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
        os.close(started_read)
    assert proc.returncode == 75, stderr[-3000:]  # saved and stopped, as on SIGTERM
    assert "KeyboardInterrupt" in stderr
    assert "Rank 1 failed" not in stderr  # rank 1 was stopped by us, it did not fail
    assert (tmp_path / "checkpoints" / "preempted.ckpt").is_file()
    assert _processes_mentioning(out) == []
