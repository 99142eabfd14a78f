"""Loading a checkpoint into modules and optimizers: a missing entry or a different number of optimizers is named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchfleet as tf
from torchfleet.errors import CheckpointError


def _setup(fleet: tf.Fleet, n_optimizers: int):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opts = [torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) for _ in range(n_optimizers)]
    model, *opts = fleet.setup(model, *opts)
    model(torch.ones(2, 3)).sum().backward()
    for opt in opts:
        opt.step()
    return model, opts


def test_a_missing_entry_and_a_different_number_of_optimizers_are_named(tmp_path):
    fleet = tf.Fleet(accelerator="cpu")
    model, opts = _setup(fleet, 2)
    path = tmp_path / "two.ckpt"
    fleet.save(path, {"model": model, "optimizers": opts})

    other, other_opts = _setup(fleet, 1)
    with pytest.raises(CheckpointError, match=r"holds 2 optimizer states under 'optimizers' but 1 optimizers"):
        fleet.load(path, {"model": other, "optimizers": other_opts})
    with pytest.raises(CheckpointError, match=r"no entry 'optimizer' to load into .*Its entries are: .*'optimizers'"):
        fleet.load(path, {"model": other, "optimizer": other_opts[0]})

    # the matching state loads: both optimizers get their momentum back
    again, again_opts = _setup(fleet, 2)
    fleet.load(path, {"model": again, "optimizers": again_opts})
    for got, want in zip(again_opts, opts):
        buf = lambda o: next(iter(o.state_dict()["state"].values()))["momentum_buffer"]  # noqa: E731
        assert torch.equal(buf(got), buf(want))
