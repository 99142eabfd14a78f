"""Fleet with a loss computed outside ``forward`` (``model.loss_step(x, y)``, ``model.net(x)``) under ddp and fsdp.

Without routing, DDP synchronises nothing for such a loss (each rank keeps its own weights, silently)
and fsdp fails on sharded parameters. A method marked with ``mark_forward_method`` runs through the
strategy's forward and trains as one process would with the global batch; unmarked ones are refused.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.distributed.scripts.fleet_train import plain_net
from tests.distributed.sharded_helpers import ROOT, child_env
from tests.distributed.test_ddp import assert_same_weights
from tests.distributed.test_fleet_ddp import one_process_reference

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fleet_forward_methods.py")


def run(strategy: str, tmp_path) -> dict:
    out = tmp_path / f"{strategy}.pt"
    proc = subprocess.run([sys.executable, SCRIPT, strategy, str(out)], capture_output=True, text=True, timeout=180,
                          env=child_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return torch.load(out)


def reference_weights() -> dict:
    # the script's model holds plain_net() as `net`: the same layers, created from the same seed
    want = one_process_reference()
    assert want.keys() == plain_net().state_dict().keys()
    return {f"net.{k}": v for k, v in want.items()}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_marked_method_trains_as_one_process_and_unmarked_calls_are_refused(tmp_path, strategy):
    result = run(strategy, tmp_path)
    # trained through the marked method: the one-process, global-batch weights, the same on both ranks
    assert_same_weights(result["weights"], reference_weights(), atol=1e-5)
    rank0, rank1 = (torch.tensor(r) for r in result["per_rank"])
    assert torch.equal(rank0, rank1)

    # an unmarked method and a submodule called directly: one error naming the way out
    assert result["unmarked"].startswith("ConfigurationError: TwoWays.unmarked_loss() was called")
    assert "model.mark_forward_method('unmarked_loss')" in result["unmarked"]
    assert result["submodule"].startswith("ConfigurationError: model.net (Sequential) was called directly")
    assert "mark_forward_method" in result["submodule"]
    if strategy == "ddp":
        assert "weights would silently differ" in result["unmarked"]
        # without gradients there is nothing to synchronise: allowed under ddp
        assert result["submodule_no_grad"] is None
        # the control run bypassed DDP through .module: the ranks' weights differ, which the check above would catch
        c0, c1 = (torch.tensor(r) for r in result["control_per_rank"])
        assert (c0 - c1).abs().max() > 1e-3
    else:
        assert "sharded" in result["unmarked"]
        # sharded parameters cannot compute outside forward at all
        assert result["submodule_no_grad"].startswith("ConfigurationError: model.net (Sequential)")

    # what must keep working: forward after the refusals, a helper that runs no layer, attributes, parameters()
    assert result["forward_after"] is None
    assert result["helper"] == 2.0
    assert result["attribute"] == [16, 4]
    assert result["parameters"] == 4
