"""Issue 19 item 4: SIGTERM, SIGINT and SIGUSR1 end every process of a 2-rank job within 10 s, with exit code 75
and one line saying why, wherever the signal finds the run: before the first step, in validation, in a
data-loader wait, or blocked in a collective that another rank never joins.

Each case runs ``scripts/signal_train.py`` (real processes over gloo), waits until the ranks wait at the
place, sends the signal to the launching process, to rank 1 only, or to every process of the job (as a
scheduler or a terminal's Ctrl-C does), and times the stop. No checkpoint can be agreed on in these places,
so none is written there: the newest complete one (ModelCheckpoint saves after every step) still loads.
The agreed stop after a training step (preempted.ckpt) is tests/distributed/test_preemption_ddp.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.distributed.scripts.fault_train import processes_with
from tests.distributed.sharded_helpers import child_env
from tests.distributed.test_fault_matrix import default_sigint, newest_complete_checkpoint, wait_gone
from torchfleet.checkpoint.consolidate import read_full_checkpoint
from torchfleet.preemption import EXIT_CODE

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "distributed", "scripts", "signal_train.py")
#: promised: every process gone within 10 s of the signal
LIMIT_S = 10.0

#: who receives the signal, per (strategy, signal): the launching process (ddp: rank 0; ddp_spawn: the process
#: that only waits, and forwards it), rank 1 alone, or every process of the job
TARGETS = {
    ("ddp", "SIGTERM"): "rank1", ("ddp", "SIGINT"): "launcher", ("ddp", "SIGUSR1"): "all",
    ("ddp_spawn", "SIGTERM"): "launcher", ("ddp_spawn", "SIGINT"): "all", ("ddp_spawn", "SIGUSR1"): "rank1",
}


def _start(tmp_path, cfg: dict) -> tuple[subprocess.Popen, str]:
    token = f"signals-{os.getpid()}-{time.time_ns()}"
    env = child_env(TF_FAULT_TOKEN=token)
    for var in ("TF_RESTART_COUNT", "SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        env.pop(var, None)
    cfg = {**cfg, "root": str(tmp_path)}
    # SIGINT at its default in the script's processes: a suite run as a background job ignores it (item 11)
    proc = subprocess.Popen([sys.executable, SCRIPT, json.dumps(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT, preexec_fn=default_sigint)
    return proc, token


def _wait_ready(proc: subprocess.Popen, tmp_path, ranks: list[int]) -> dict[int, int]:
    """The pid of each rank once it waits at the place (its ``ready-<rank>`` file)."""
    deadline = time.monotonic() + 120
    paths = {r: tmp_path / f"ready-{r}" for r in ranks}
    while not all(p.exists() for p in paths.values()):
        if proc.poll() is not None or time.monotonic() > deadline:
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"the run never reached its wait (exit code {proc.returncode}):\n{err[-4000:]}")
        time.sleep(0.05)
    return {r: int(p.read_text()) for r, p in paths.items()}


def _signal(proc: subprocess.Popen, token: str, pids: dict[int, int], target: str, sig: signal.Signals) -> float:
    sent = time.time()
    if target == "launcher":
        os.kill(proc.pid, sig)
    elif target == "rank1":
        os.kill(pids[1], sig)
    else:  # every process of the job, as scancel or a terminal's Ctrl-C
        for pid in processes_with(token):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    return sent


def _run_case(tmp_path, cfg: dict, sig_name: str, target: str) -> str:
    """Start, wait for the place, signal, and check what every case promises; the one line."""
    proc, token = _start(tmp_path, cfg)
    try:
        waiting = [1] if cfg["place"] == "collective" else [0, 1]
        pids = _wait_ready(proc, tmp_path, waiting)
        sent = _signal(proc, token, pids, target, getattr(signal, sig_name))
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    gone = wait_gone(token, LIMIT_S + 5)
    assert gone - sent < LIMIT_S, f"{gone - sent:.1f} s from the signal to every process gone\n{stderr[-3000:]}"
    assert proc.returncode == EXIT_CODE, stderr[-4000:]
    assert "Traceback" not in stderr, stderr[-4000:]
    lines = [line for line in stderr.splitlines() if f"Exit code {EXIT_CODE}" in line]
    assert len(lines) == 1, stderr[-4000:]
    line = lines[0]
    assert line.startswith("torchfleet: ") and sig_name in line, line
    return line


# every place with every signal (12 cases), the two launch paths taking turns: each strategy meets every place and
# every signal, in half the time of the full 24 (the signal handling is shared; the launch path is what differs)
_PLACES, _SIGNALS = ("start", "val", "data", "collective"), ("SIGTERM", "SIGINT", "SIGUSR1")
CASES = [(("ddp", "ddp_spawn")[(i + j) % 2], place, sig) for i, place in enumerate(_PLACES)
         for j, sig in enumerate(_SIGNALS)]


@pytest.mark.parametrize("strategy,place,sig", CASES)
def test_trainer_stops_every_process_within_10_s_with_exit_75(tmp_path, strategy, place, sig):
    cfg = {"api": "trainer", "strategy": strategy, "place": place}
    if place == "data" and sig == "SIGUSR1":
        cfg["workers"] = 1  # the wait is in a loader worker, a process of its own that must go too
    line = _run_case(tmp_path, cfg, sig, TARGETS[strategy, sig])
    expected = {"start": "before the first training step", "val": "during validation",
                "data": "with no training step completed", "collective": ""}[place]
    assert expected in line, line
    ckpt = newest_complete_checkpoint(str(tmp_path / "ckpt"))
    assert not (tmp_path / "ckpt" / "preempted.ckpt").exists()  # nothing can be agreed on in these places
    if place == "start":
        assert ckpt is None and "none was saved before" in line, line
    else:  # the newest checkpoint, written before the signal, is complete and named in the line
        assert ckpt is not None and f"stays: {ckpt}" in line, line
        saved = read_full_checkpoint(ckpt, with_optimizer=False)
        assert saved["global_step"] == (2 if place == "val" else 3)
        assert not [n for n in os.listdir(tmp_path / "ckpt") if n.startswith(".")]  # no save left half-done


def test_fsdp_blocked_in_a_collective_stops_every_process(tmp_path):
    line = _run_case(tmp_path, {"api": "trainer", "strategy": "fsdp", "place": "collective"}, "SIGTERM", "launcher")
    assert re.search(r"waited [0-9.]+ s in collective #\d+", line), line
    ckpt = newest_complete_checkpoint(str(tmp_path / "ckpt"))
    assert ckpt is not None and read_full_checkpoint(ckpt, with_optimizer=False)["global_step"] == 3


@pytest.mark.parametrize("strategy,place,sig,target,reads", [
    ("ddp", "collective", "SIGTERM", "launcher", True),
    ("ddp_spawn", "data", "SIGINT", "all", True),
    ("ddp", "start", "SIGUSR1", "rank1", False),
    ("ddp_spawn", "collective", "SIGTERM", "launcher", False),
    ("ddp", "data", "SIGINT", "launcher", False),
])
def test_fleet_stops_every_process_within_10_s_with_exit_75(tmp_path, strategy, place, sig, target, reads):
    # with "reads" the loop asks fleet.preemption_requested each step, but its steps stop coming; without, nothing
    # in the loop can save: either way the job ends at once, and no checkpoint is made up
    _run_case(tmp_path, {"api": "fleet", "strategy": strategy, "place": place, "reads": reads}, sig, target)
    assert not (tmp_path / "preempted.pt").exists()
