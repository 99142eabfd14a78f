"""Re-seeding at setup, as Lightning does: random numbers drawn between ``seed_everything`` and ``fit`` (a replay
buffer's warm-up) do not shift a ddp run, and still shift a single-device one (Lightning's SingleDeviceStrategy
does not re-seed). Real processes over gloo; the program is tests/distributed/scripts/reseed_train.py, which
also runs under Lightning, so where a Lightning environment exists the weights are compared with Lightning's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.distributed import sharded_helpers
from tests.lightning_reference import LIGHTNING_PYTHON, needs_lightning

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "reseed_train.py")
#: (strategy, devices, warm-up drawn, training loaders): one launch per library and (strategy, devices) fits them all
RUNS = [("auto", 1, False, "one"), ("auto", 1, True, "one"), ("ddp", 2, False, "one"), ("ddp", 2, True, "one"),
        ("ddp", 2, False, "dict")]
#: what Lightning runs too: the warmed-up runs, and the dict of training loaders
LIGHTNING_RUNS = [("auto", 1, True, "one"), ("ddp", 2, True, "one"), ("ddp", 2, False, "dict")]


def _launch(python: str, lib: str, runs: list[tuple], folder) -> dict:
    """Rank 0's weights of each run; the runs of one (strategy, devices) are fitted in turn by one launch, each from
    ``seed_everything`` on (scripts/reseed_train.py)."""
    results = {}
    for strategy, devices in dict.fromkeys(run[:2] for run in runs):
        mine = [run for run in runs if run[:2] == (strategy, devices)]
        outs = [str(folder / f"{lib}-{strategy}-{warmup}-{loaders}.pt") for _, _, warmup, loaders in mine]
        cfg = {"lib": lib, "strategy": strategy, "devices": devices, "sanity": 2, "runs": [
            {"warmup": warmup, "loaders": loaders, "out": out} for (_, _, warmup, loaders), out in zip(mine, outs)]}
        proc = subprocess.run([python, SCRIPT, json.dumps(cfg)], capture_output=True, text=True,
                              timeout=300, env=sharded_helpers.child_env(), cwd=sharded_helpers.ROOT)
        assert proc.returncode == 0, proc.stderr[-6000:]
        results.update({run: torch.load(out, weights_only=True) for run, out in zip(mine, outs)})
    return results


@pytest.fixture(scope="module")
def torchfleet_runs(tmp_path_factory) -> dict:
    return _launch(sys.executable, "torchfleet", RUNS, tmp_path_factory.mktemp("reseed"))


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory) -> dict:
    return _launch(LIGHTNING_PYTHON, "lightning", LIGHTNING_RUNS, tmp_path_factory.mktemp("reseed-lightning"))


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_ddp_reseeds_so_a_warmup_does_not_shift_training(torchfleet_runs):
    assert _equal(torchfleet_runs[("ddp", 2, True, "one")], torchfleet_runs[("ddp", 2, False, "one")])


def test_single_device_does_not_reseed_as_in_lightning(torchfleet_runs):
    # the warm-up moved the generators; with no re-seed the shuffle and dropout draw other numbers
    assert not _equal(torchfleet_runs[("auto", 1, True, "one")], torchfleet_runs[("auto", 1, False, "one")])


@needs_lightning
@pytest.mark.parametrize("run", [("auto", 1, True, "one"), ("ddp", 2, True, "one")], ids=["single_device", "ddp"])
def test_weights_equal_lightnings_bitwise(torchfleet_runs, lightning_runs, run):
    assert _equal(torchfleet_runs[run], lightning_runs[run])


@needs_lightning
def test_a_dict_of_training_loaders_under_ddp_equals_lightnings_bitwise(torchfleet_runs, lightning_runs):
    """Two loaders combined ("max_size_cycle"), each sharded by its own DistributedSampler, on 2 processes."""
    run = ("ddp", 2, False, "dict")
    assert _equal(torchfleet_runs[run], lightning_runs[run])


_FLEET_PROGRAM = """
import torch, torchfleet as tf
tf.seed_everything(3)
expected = torch.rand(4)
tf.seed_everything(3)
torch.rand(100)  # drawn after seeding, before the strategy is set up
fleet = tf.Fleet(accelerator="cpu", devices=1, strategy={strategy!r})
fleet.launch()
print("RESEEDED" if torch.equal(torch.rand(4), expected) else "KEPT")
"""


@pytest.mark.parametrize("strategy,expected", [("ddp", "KEPT"), ("fsdp", "RESEEDED")])
def test_fleet_reseeds_as_fabric(strategy, expected):
    """Fabric's DDPStrategy does not re-seed at setup; its FSDP and DeepSpeed strategies do (one process here)."""
    proc = subprocess.run([sys.executable, "-c", _FLEET_PROGRAM.format(strategy=strategy)], capture_output=True,
                          text=True, timeout=300, env=sharded_helpers.child_env(), cwd=sharded_helpers.ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == expected
