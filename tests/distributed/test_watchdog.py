"""Hang and desync diagnosis with real processes over gloo: one report naming each rank's collective.

Each run is rank-divergent on purpose (tests/distributed/scripts/hang_train.py) with hang_timeout of a few
seconds; without the watchdog each would end in gloo's "Connection closed by peer" naming nothing, or wait
for the 30-minute collective timeout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.distributed.test_ddp import ROOT

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "distributed", "scripts", "hang_train.py")
HANG_EXIT_CODE = 76  # written out: the documented exit code, not read from the code under test


def _line(marker: str) -> str:
    """``hang_train.py:<n>`` of the line carrying ``marker`` in the script."""
    with open(SCRIPT) as f:
        for n, text in enumerate(f, 1):
            if f"# {marker}" in text:
                return f"hang_train.py:{n}"
    raise AssertionError(marker)


def _run(case: str, hang_timeout: float = 4, timeout: float = 90, torchrun: bool = False) -> tuple[str, float, int]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), ROOT]))
    for var in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
        env.pop(var, None)
    cfg = json.dumps({"case": case, "hang_timeout": hang_timeout})
    command = [sys.executable, SCRIPT, cfg]
    if torchrun:
        from torchfleet.environments.local import find_free_port

        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                   f"--master-port={find_free_port()}", SCRIPT, cfg]
    start = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    return proc.stderr, time.monotonic() - start, proc.returncode


def test_a_rank_that_skips_a_synced_log_is_reported_as_a_desync_naming_both_call_sites():
    stderr, elapsed, code = _run("skip_log")
    assert code != 0
    # gloo aborts the rank whose collective receives the wrong size: rank 0 (the launching process, then rank 1
    # reports) or rank 1 (then rank 0 does); either way one report names the first collective that differs
    desync = next(line for line in stderr.splitlines() if "Desync:" in line)
    assert f"all_reduce(self.log 'train_loss' sync_dist) at {ROOT}/tests/distributed/scripts/{_line('LOG-LINE')}" \
        in desync
    assert "backward (gradient synchronisation)" in desync and "hang_train.py:" in desync.split("rank 1")[-1]
    # rank 0 is at batch 2 while rank 1, which skipped its sync there, is at batch 3
    assert "batch 2" in desync and "batch 3" in desync
    assert elapsed < 60, f"took {elapsed:.0f}s"


def test_an_extra_all_gather_on_one_rank_is_a_desync_at_its_call_site():
    stderr, elapsed, code = _run("extra_gather")
    assert code != 0
    desync = next(line for line in stderr.splitlines() if "Desync:" in line)
    assert f"rank 0 all_gather(self.all_gather) at {ROOT}/tests/distributed/scripts/{_line('GATHER-LINE')}" in desync
    assert "rank 1 backward (gradient synchronisation)" in desync
    assert elapsed < 60


def test_a_rank_sleeping_in_user_code_is_a_hang_report_with_its_stack():
    stderr, elapsed, code = _run("sleep", hang_timeout=3)
    assert code == HANG_EXIT_CODE
    assert "Rank 0 waited in one collective longer than hang_timeout" in stderr
    barrier = _line("BARRIER-LINE")
    assert re.search(rf"rank 0: in #\d+ barrier\(before batch 3\) for [\d.]+s, called at \S*{barrier}", stderr)
    assert re.search(r"rank 1: not in a collective; its last was #\d+ all_reduce\(self.log 'train_loss'", stderr)
    assert "Hang: rank 0 waits in" in stderr and "which rank 1 never reached" in stderr
    # rank 1's own stack shows where it is: the sleep in training_step
    stack = stderr.split("Python stack of rank 1")[1]
    assert f'hang_train.py", line {_line("SLEEP-LINE").split(":")[1]} in training_step' in stack
    assert "desync" not in stderr.lower().split("python stack")[0]
    assert elapsed < 45, f"took {elapsed:.0f}s: the sleeping rank (60 s) was waited for"


def test_ddp_spawn_raises_the_report_in_the_launching_process():
    import torch
    from torch.utils.data import DataLoader

    import torchfleet as tf
    from tests.distributed.scripts.hang_train import Net, data
    from torchfleet.launchers import ProcessFailedError

    trainer = tf.Trainer(accelerator="cpu", strategy="ddp_spawn", devices=2, max_epochs=1, log_every_n_steps=1,
                         enable_progress_bar=False, enable_model_summary=False, logger=False,
                         enable_checkpointing=False, num_sanity_val_steps=0, hang_timeout=3)
    torch.manual_seed(0)
    start = time.monotonic()
    with pytest.raises(ProcessFailedError) as info:
        trainer.fit(Net("skip_log"), DataLoader(data(), batch_size=4))
    assert time.monotonic() - start < 60
    error = info.value
    assert error.diagnosis == "desync"
    assert f"{_line('LOG-LINE')} (training epoch 0 batch 2)" in error.collectives
    assert "backward (gradient synchronisation)" in error.collectives


def test_fleet_extra_all_reduce_on_one_rank_is_a_desync():
    stderr, elapsed, code = _run("fleet_reduce")
    assert code != 0
    desync = next(line for line in stderr.splitlines() if "Desync:" in line)
    assert _line("FLEET-EXTRA-LINE") in desync and "all_reduce(fleet.all_reduce)" in desync
    assert _line("FLEET-BARRIER-LINE") in desync and "barrier(end of step)" in desync
    assert elapsed < 60


def test_under_torchrun_each_rank_prints_its_part_and_exits_non_zero():
    stderr, elapsed, code = _run("torchrun_sleep", hang_timeout=3, torchrun=True)
    assert code != 0
    assert "torchfleet: rank 0 of 2 waited longer than hang_timeout=3s" in stderr
    assert re.search(rf"rank 0: in #\d+ barrier\(before batch 3\) for [\d.]+s, called at \S*{_line('BARRIER-LINE')}",
                     stderr)
    assert "torchfleet: rank 1 of 2 stops: another rank found a hang or a desync" in stderr
    assert f'line {_line("SLEEP-LINE").split(":")[1]} in training_step' in stderr
    assert elapsed < 45


def test_under_torchrun_a_desync_is_found_through_the_rendezvous_store_before_hang_timeout():
    stderr, elapsed, code = _run("extra_gather", hang_timeout=30, torchrun=True)
    assert code != 0
    assert "found the ranks waiting in different collectives (a desync)" in stderr
    desync = next(line for line in stderr.splitlines() if "Desync:" in line)
    assert f"all_gather(self.all_gather) at {ROOT}/tests/distributed/scripts/{_line('GATHER-LINE')}" in desync
    assert "backward (gradient synchronisation)" in desync
    assert elapsed < 25, f"took {elapsed:.0f}s: waited for hang_timeout (30 s) instead of finding the desync"


def _mismatched_reduce(rank: int, port: int, out: str) -> None:
    import torch

    from torchfleet import watchdog
    from torchfleet.accelerators.cpu import CPUAccelerator
    from torchfleet.environments.local import LocalEnvironment
    from torchfleet.strategies.ddp import DDPStrategy
    from torchfleet.strategies.parallel import CollectiveMismatchError

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                      NODE_RANK="0")
    strategy = DDPStrategy(accelerator=CPUAccelerator())
    strategy.configure([torch.device("cpu")] * 2, 1, LocalEnvironment())
    strategy.hang_timeout = None
    strategy.setup_environment()
    # the same size and dtype, so gloo pairs them: only the fingerprint tells them apart
    with watchdog.labelled("self.log 'a' sync_dist" if rank == 0 else "fleet.all_reduce"):
        try:
            strategy.reduce(torch.tensor([1.0 + rank]), reduce_op="sum")
            result = "no error"
        except CollectiveMismatchError as exc:
            result = str(exc)
    with open(f"{out}.{rank}", "w") as f:
        f.write(result)


def test_debug_mode_fingerprints_all_reduce_so_paired_different_collectives_raise(tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    from torchfleet.environments.local import find_free_port

    monkeypatch.setenv("TORCHFLEET_CHECK_COLLECTIVES", "1")  # read when the spawned ranks import torchfleet
    out = str(tmp_path / "result")
    mp.spawn(_mismatched_reduce, args=(find_free_port(), out), nprocs=2)
    results = [open(f"{out}.{rank}").read() for rank in range(2)]
    assert all(r.startswith("Desync: this rank's collective #1 ") for r in results), results
    assert "all_reduce(self.log 'a' sync_dist)" in results[0] and "all_reduce(fleet.all_reduce)" in results[1]
