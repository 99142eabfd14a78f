"""The tensor/sequence/loss-parallel Transformer example: it learns in one process, and TP2xDP2 and TP4 on 4 CPU
processes (gloo) end with the one-process weights and losses (fp32, AdamW, 8 steps over 2 epochs)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.distributed.scripts import tp_transformer_train as script
from tests.distributed.sharded_helpers import assert_close
from torchfleet.examples import tp_transformer as example

ATOL = 1e-5


def test_the_example_runs_from_its_command_line_and_learns():
    rank_names = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK")
    before = {n: os.environ.get(n) for n in rank_names}
    try:
        model = example.main(["--devices", "1", "--epochs", "2"])
        assert model.device_mesh.shape == (1, 1)  # one process: a 1x1 mesh, nothing split
        assert len(model.losses) == 16 and model.losses[-1] < model.losses[0] - 0.5
        # the launch of one process gave back the rank variables it set: a later Trainer in this process is not
        # taken for a rank another launcher started
        assert {n: os.environ.get(n) for n in rank_names} == before
    finally:  # the 1-process group the strategy joined stays up (as Lightning's); later tests expect none
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_the_data_follow_the_documented_rule():
    cfg = example.Config()
    x, y = example.make_data(cfg, 200)[:]
    assert (x[:, 1:] == y[:, :-1]).all()  # targets are the inputs shifted by one
    follows = (y == (3 * x + 1) % cfg.vocab).float().mean().item()
    assert 0.85 < follows < 0.97  # 10% of the tokens are noise (some of which hit the rule by chance)


@pytest.fixture(scope="module")
def ref(tp_transformer_reference) -> dict:
    return tp_transformer_reference


@pytest.fixture(scope="module")
def runs(four_process_runs) -> dict:
    """This file's runs (tests/distributed/model_parallel_launches.py), from the 4-process launch the session shares."""
    return four_process_runs["tp_example"]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize(("name", "mesh"), [("tp2dp2", (2, 2)), ("tp4", (1, 4))])
def test_four_processes_equal_one(runs, ref, name, mesh):
    got = runs[name]
    assert got["mesh"] == (("data_parallel", "tensor_parallel"), mesh)
    assert got["global_step"] == ref["global_step"] == script.STEPS
    assert_close(got["weights"], ref["weights"], ATOL)
    assert got["losses"] == pytest.approx(ref["losses"], abs=ATOL)
    assert ref["losses"][-1] < ref["losses"][0] - 0.5  # it learnt something, so equal weights say something
    # loss parallel: the logits reach the cross-entropy split along the vocabulary, never gathered
    assert got["logits_layout"] == "('tensor_parallel',) (Shard(dim=2),)"
    assert ref["logits_layout"] == "plain"
