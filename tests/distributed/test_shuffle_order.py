"""A ddp Trainer's training loader shuffles as Lightning's does; Fleet keeps the loader's order as Fabric does.

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
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler, TensorDataset

import torchfleet
from tests.distributed.scripts.shuffle_order import BATCH, EPOCHS, SAMPLES, SEED
from torchfleet.samplers import shuffled_for_training

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "shuffle_order.py")
SRC = os.path.dirname(os.path.dirname(torchfleet.__file__))
LIGHTNING_PYTHON = os.environ.get("TF_LIGHTNING_PYTHON", "/work/venv-lightning/bin/python")
APIS = ("trainer", "fleet")


def _run(python: str, library: str, out: str) -> dict[str, list[list]]:
    """Each API's batches, per rank and epoch: the Trainer's, then the loop's, from one launch."""
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
    for api in APIS:
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


@pytest.mark.skipif(not os.path.exists(LIGHTNING_PYTHON), reason=f"no Python with Lightning at {LIGHTNING_PYTHON}")
@pytest.mark.parametrize("api", ["trainer", "fleet"])
def test_same_batches_as_lightning_runs_the_same_program(runs, lightning_runs, api):
    assert runs[api] == lightning_runs[api]


def test_only_an_in_order_default_sampler_is_made_to_shuffle():
    dataset = TensorDataset(torch.arange(6))
    in_order = shuffled_for_training(DataLoader(dataset, batch_size=2, num_workers=0, drop_last=True))
    assert type(in_order.sampler) is RandomSampler and (in_order.batch_size, in_order.drop_last) == (2, True)
    shuffled = DataLoader(dataset, shuffle=True)
    assert shuffled_for_training(shuffled) is shuffled
    own = DataLoader(dataset, sampler=SequentialSampler(range(3)))  # a sampler of the user's: kept
    assert shuffled_for_training(own) is own
    assert shuffled_for_training([1, 2]) == [1, 2]
