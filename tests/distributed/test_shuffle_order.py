"""A ddp Trainer's training loader shuffles as Lightning's does; Fleet keeps the loader's order as Fabric does, and
moves the loader's samplers to the next epoch at each pass, as Fabric does.

2 real CPU processes over gloo (tests/distributed/scripts/shuffle_order.py; one launch per library runs the Trainer,
then the Fleet or Fabric loop in the same processes). The expected batches follow Lightning's
rule, computed here with torch's DistributedSampler: the Trainer's is built with ``shuffle=True`` and the global seed
whatever the loader's ``shuffle``, reshuffled each epoch by ``set_epoch``; Fabric's keeps ``shuffle=False``. Where a
Python with Lightning is at hand (``TF_LIGHTNING_PYTHON``, default /work/venv-lightning/bin/python), the same
program also runs under Lightning and the batches must be the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from torch.utils.data import DistributedSampler

import torchfleet
from tests.distributed.scripts.shuffle_order import BATCH, EPOCHS, SAMPLES, SEED

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "shuffle_order.py")
SRC = os.path.dirname(os.path.dirname(torchfleet.__file__))
LIGHTNING_PYTHON = os.environ.get("TF_LIGHTNING_PYTHON", "/work/venv-lightning/bin/python")
APIS = ("trainer", "fleet")
RESULTS = ("trainer", "fleet", "fleet_shuffled", "fleet_samplers")


def _run(python: str, library: str, out: str) -> dict[str, list]:
    """Each result's per-rank record (``RESULTS``): the Trainer's batches, then the Fleet loops', from one launch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "PL_", "MASTER_", "LOCAL_RANK", "RANK"))}
    if library == "torchfleet":
        env["PYTHONPATH"] = os.pathsep.join([SRC, os.path.dirname(SRC)])
    else:
        env.pop("PYTHONPATH", None)  # Lightning's own environment, without torchfleet's test tree
    os.makedirs(out)
    proc = subprocess.run([python, SCRIPT, library, ",".join(APIS), out], cwd=out, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{library} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    runs = {}
    for api in RESULTS:
        runs[api] = []
        for rank in range(2):
            with open(os.path.join(out, api, f"rank{rank}.json")) as f:
                runs[api].append(json.load(f))
    return runs


def _expected(shuffle: bool) -> list[list]:
    dataset = list(range(SAMPLES))
    out = []
    for rank in range(2):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=shuffle, seed=SEED)
        epochs = []
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            order = list(sampler)
            epochs.append([order[i:i + BATCH] for i in range(0, len(order), BATCH)])
        out.append(epochs)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list]:
    return _run(sys.executable, "torchfleet", str(tmp_path_factory.mktemp("shuffle") / "torchfleet"))


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory) -> dict[str, list]:
    return _run(LIGHTNING_PYTHON, "lightning", str(tmp_path_factory.mktemp("shuffle") / "lightning"))


def test_trainer_shuffles_the_training_loader_as_lightning(runs):
    expected = _expected(shuffle=True)
    assert runs["trainer"] == expected
    # the ranks read disjoint halves, in a new order each epoch
    for epoch in range(EPOCHS):
        halves = [sum(runs["trainer"][rank][epoch], []) for rank in range(2)]
        assert sorted(halves[0] + halves[1]) == list(range(SAMPLES))
    assert runs["trainer"][0][0] != runs["trainer"][0][1]


def test_fleet_keeps_the_loaders_order_as_fabric(runs):
    assert runs["fleet"] == _expected(shuffle=False)


def test_fleet_moves_a_shuffled_loader_to_the_next_epoch_at_each_pass(runs):
    """The program never calls set_epoch: each pass over the set-up loader is the next epoch, as under Fabric."""
    shuffled = runs["fleet_shuffled"]
    assert [rank["batches"] for rank in shuffled] == _expected(shuffle=True)
    for epoch in range(EPOCHS):
        halves = [sum(shuffled[rank]["batches"][epoch], []) for rank in range(2)]
        assert sorted(halves[0] + halves[1]) == list(range(SAMPLES))
    assert len({str(shuffled[0]["batches"][epoch]) for epoch in range(EPOCHS)}) == EPOCHS
    # ddp kept the two models alike on both ranks
    assert shuffled[0]["weights"] == shuffled[1]["weights"]


def test_fleet_tells_a_users_sampler_each_epoch(runs):
    """Through ``sampler=`` and through ``batch_sampler=``'s sampler: the epochs 0, 1, 2, and the ranks' shares
    of each epoch are the dataset (indices: SAMPLES is even, nothing repeats; the user's 7 batches dealt whole to
    2 ranks repeat the first batch to even them out)."""
    for kind in ("sampler", "batch_sampler"):
        for rank in range(2):
            assert runs["fleet_samplers"][rank][kind]["heard"][-EPOCHS:] == list(range(EPOCHS)), kind
        epochs = [[runs["fleet_samplers"][rank][kind]["seen"][epoch] for rank in range(2)] for epoch in range(EPOCHS)]
        for halves in epochs:
            read = halves[0] + halves[1]
            assert sorted(read if kind == "sampler" else set(read)) == list(range(SAMPLES)), kind
        assert epochs[0] != epochs[1] != epochs[2], kind  # the sampler's order follows the epoch it heard


@pytest.mark.skipif(not os.path.exists(LIGHTNING_PYTHON), reason=f"no Python with Lightning at {LIGHTNING_PYTHON}")
@pytest.mark.parametrize("api", ["trainer", "fleet", "fleet_shuffled"])
def test_same_batches_as_lightning_runs_the_same_program(runs, lightning_runs, api):
    """Bitwise: the same batches and, for the two-optimizer program, the same losses and weights."""
    assert runs[api] == lightning_runs[api]


@pytest.mark.skipif(not os.path.exists(LIGHTNING_PYTHON), reason=f"no Python with Lightning at {LIGHTNING_PYTHON}")
def test_users_samplers_hear_the_epochs_fabric_tells_them(runs, lightning_runs):
    """Through ``sampler=``, the epochs heard are Fabric's; the order differs on purpose (Fabric shuffles the user's
    sampler's items per rank again; torchfleet deals them out in the sampler's order: docs/porting.md). Through
    ``batch_sampler=``, Fabric 2.6.6 on 2 processes rebuilds the loader around its default sampler and drops the
    user's batch sampler (its sampler hears nothing, single samples come out), so only torchfleet's side is checked
    there (test_fleet_tells_a_users_sampler_each_epoch)."""
    ours, fabric = runs["fleet_samplers"], lightning_runs["fleet_samplers"]
    for rank in range(2):
        assert ours[rank]["sampler"]["heard"] == fabric[rank]["sampler"]["heard"]
        assert fabric[rank]["batch_sampler"]["heard"] == []  # as described above: re-check if Fabric changes
