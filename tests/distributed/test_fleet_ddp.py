"""Fleet (custom loops) under ddp, ddp_spawn and ddp_fork: same weights as one process, working collectives."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.distributed.scripts.ddp_train import make_data
from tests.distributed.scripts.fleet_train import EPOCHS, plain_net
from tests.distributed.test_ddp import ROOT, assert_same_weights, pythonpath

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fleet_train.py")


def one_process_reference() -> dict:
    model = plain_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(EPOCHS):
        for x, y in DataLoader(make_data(), batch_size=16):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return model.state_dict()


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn", "ddp_fork"])
def test_fleet_loop_matches_one_process_and_collectives_work(tmp_path, strategy):
    out = tmp_path / "result.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=pythonpath())
    proc = subprocess.run([sys.executable, SCRIPT, strategy, str(out)], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = torch.load(out)
    assert_same_weights(result["weights"], one_process_reference())
    assert result["world_size"] == 2
    assert result["gathered"] == [0.0, 1.0]
    assert result["uneven"] == [[0.0], [1.0, 1.0]]
    assert result["sum"] == 3.0 and result["max"] == 1.0
    assert result["broadcast"] == {"from": 1}


def test_fleet_launch_without_a_function_under_spawn_is_refused():
    import torchfleet as tf
    from torchfleet.errors import ConfigurationError

    fleet = tf.Fleet(strategy="ddp_spawn", accelerator="cpu", devices=2)
    with pytest.raises(ConfigurationError, match=r"fleet\.launch\(train\)"):
        fleet.launch()
