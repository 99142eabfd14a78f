"""fsdp gives ddp's numbers for what users write (issue 34): 2 real CPU processes over gloo, one launch.

tests/distributed/scripts/fsdp_like_ddp.py runs each program under ddp, then under fsdp in the same processes
(the fsdp Fleet set up without ``launch()``, as under torchrun): ``module.zero_grad()`` between forward and
backward (Fleet and the Trainer), a module returning a ``torch.distributions.Normal`` (a unit of its own, and the
root), a Fabric-style image classifier, and a k-fold loop resetting its model per fold; and under fsdp the error for
an output fully_shard cannot look into.

Tolerance: the programs start from the same weights, data and generator states, and on 2 ranks both strategies
average two gradients by a division by 2, which is exact; the forward and backward kernels see the same whole
tensors. What may differ is the order of the sums inside fully_shard's reduce-scatter against DDP's bucketed
all-reduce, a rounding of float32 (about 1e-7 relative per step). ``RTOL``/``ATOL`` leave room for that over the
programs' few dozen steps; measured on this machine: every value bitwise equal.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.distributed import sharded_helpers

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fsdp_like_ddp.py")
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    cfg = {"out": str(tmp_path_factory.mktemp("fsdp_like_ddp") / "results.pt")}
    return sharded_helpers.load_results(cfg, sharded_helpers.run_script(SCRIPT, cfg, timeout=400))


def _close(got, want) -> None:
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            _close(got[key], want[key])
    else:
        torch.testing.assert_close(torch.as_tensor(got), torch.as_tensor(want), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("api", ["zero_grad", "zero_grad_trainer"])
def test_zero_grad_between_forward_and_backward_clears_as_under_ddp(results, api):
    ddp, fsdp = results["ddp"][api], results["fsdp"][api]
    assert len(ddp) == 3 and ddp[0] > 0
    # lr=0 and the same batch: three identical steps, so ddp's norms are equal, and fsdp's must not pile up
    assert ddp[0] == ddp[1] == ddp[2]
    _close(fsdp, ddp)


def test_a_module_returning_a_distribution_trains_as_under_ddp(results):
    for fsdp in (results["fsdp"]["distributions"], results["fsdp_root_distributions"]):
        _close(fsdp, results["ddp"]["distributions"])
    assert results["ddp"]["distributions"]["losses"][0] != results["ddp"]["distributions"]["losses"][1]  # it trained


@pytest.mark.parametrize("program", ["image", "kfold_reset_parameters", "kfold_load_state_dict"])
def test_fabric_style_programs_give_ddps_numbers(results, program):
    ddp, fsdp = results["ddp"][program], results["fsdp"][program]
    _close(fsdp, ddp)
    losses = ddp.get("test_losses", ddp.get("val_losses"))
    assert len(losses) == 3 and len(set(losses)) == 3  # three epochs (folds), each its own number


def test_an_output_fully_shard_cannot_look_into_is_refused_naming_the_module(results):
    message = results["fsdp_opaque_output"]
    assert message.startswith("ReturnsBoxed.forward returned an object of class Boxed holding tensors that need "
                              "gradients."), message
    assert "torch.distributions" in message and "a dict of the tensors" in message
