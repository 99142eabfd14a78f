"""ModelParallelStrategy with the features a Module applies itself: precision, activation checkpointing and
torch.compile per block inside ``configure_model`` (the tensor/sequence/loss-parallel Transformer example).

One launch of 4 CPU processes (gloo; shared with the other model-parallel test files,
tests/distributed/model_parallel_launches.py), TP2xDP2, trains the example five times; the references are the same
Module in this process (single_device, float32, the global batch):

- ``precision="bf16-mixed"``: the Trainer's autocast: parameters stay float32, the logits come out bfloat16;
- ``precision="bf16-true"``: the parameters themselves are bfloat16 (sharded DTensors of bfloat16);
- FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` given to ``fully_shard`` in
  ``configure_model``: float32 parameters stored, bfloat16 compute;
- activation checkpointing per block: the attention's forward runs twice a step, weights equal fp32's;
- ``torch.compile`` per block (a counting backend that runs dynamo's graphs as captured; inductor's C++
  compilation takes minutes on CPU): graphs were captured and the weights equal fp32's.

bfloat16 keeps 8 bits of mantissa, so its losses agree with float32's to about 1e-2, not 1e-5.
"""

from __future__ import annotations

import pytest

from tests.distributed.scripts import tp_transformer_train as script
from tests.distributed.sharded_helpers import assert_close

ATOL = 1e-5
#: bfloat16 against float32, per step's loss (measured here: the last step differs by 0.02 under bf16-true, < 1e-3 otherwise)
BF16_LOSS_ATOL = {"bf16_mixed": 0.01, "bf16_true": 0.05, "fsdp_bf16": 0.01}
MESH = (("data_parallel", "tensor_parallel"), (2, 2))


@pytest.fixture(scope="module")
def ref(tp_transformer_reference) -> dict:
    return tp_transformer_reference


@pytest.fixture(scope="module")
def runs(four_process_runs) -> dict:
    """This file's runs (tests/distributed/model_parallel_launches.py), from the 4-process launch the session shares."""
    return four_process_runs["features"]


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in b)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize(("name", "stored", "computed"), [
    ("bf16_mixed", {"torch.float32"}, "torch.bfloat16"),
    ("bf16_true", {"torch.bfloat16"}, "torch.bfloat16"),
    ("fsdp_bf16", {"torch.float32"}, "torch.bfloat16"),
])
def test_bfloat16_stores_and_computes_in_the_expected_dtypes_and_tracks_float32(runs, ref, name, stored, computed):
    got = runs[name]
    assert got["mesh"] == MESH and got["global_step"] == script.STEPS
    assert got["param_dtypes"] == stored
    assert got["logits_dtype"] == computed and ref["logits_dtype"] == "torch.float32"
    assert got["losses"] == pytest.approx(ref["losses"], abs=BF16_LOSS_ATOL[name])
    assert got["losses"][-1] < got["losses"][0] - 0.5  # it trains
    assert _max_diff(got["weights"], ref["weights"]) > ATOL  # bfloat16 did round: the runs are not float32's


@pytest.mark.distributed
@pytest.mark.slow
def test_activation_checkpointing_per_block_recomputes_and_equals_float32(runs, ref):
    got = runs["recompute"]
    assert ref["attention_calls"] == script.STEPS
    assert got["attention_calls"] == 2 * script.STEPS  # forward, then again in the backward
    assert_close(got["weights"], ref["weights"], ATOL)


@pytest.mark.distributed
@pytest.mark.slow
def test_torch_compile_per_block_trains_the_compiled_graphs_and_equals_float32(runs, ref):
    got = runs["compile"]
    assert got["graphs"] >= 1
    assert_close(got["weights"], ref["weights"], ATOL)
    assert got["losses"] == pytest.approx(ref["losses"], abs=ATOL)
