"""ModelParallelStrategy on CUDA devices with nccl: the tensor/sequence/loss-parallel Transformer example.

The runs reuse tests/distributed/scripts/tp_transformer_train.py (the gloo tests' script) with
``"accelerator": "cuda"``: TP2 on 2 GPUs and TP2xDP2 / TP4 on 4 must end with the weights of one process on one
GPU (fp32, within 1e-5, as on CPU); on 2 GPUs bf16-mixed, FSDP2's bfloat16 policy and activation checkpointing
per block train as they do over gloo (tests/strategies/test_model_parallel_features.py).
"""

from __future__ import annotations

import pytest

from tests.distributed import sharded_helpers
from tests.distributed.scripts import tp_transformer_train as script
from tests.distributed.sharded_helpers import assert_close, load_results
from tests.gpu.conftest import needs_cuda

ATOL = 1e-5
CUDA = {"accelerator": "cuda"}


@pytest.fixture(scope="module")
def cuda_reference() -> dict:
    """One process on one GPU with the global batch."""
    return script.train({"name": "ref", "strategy": "single_device", **CUDA}, 1)


def _launch(tmp_path, devices: int, runs: list[dict]) -> dict:
    cfg = {"devices": devices, "runs": [{**run, **CUDA} for run in runs], "out": str(tmp_path / "results.pt")}
    return load_results(cfg, sharded_helpers.run_script(script.__file__, cfg, timeout=600))


@needs_cuda(2, "TP2 over nccl equals one GPU; bf16 and activation checkpointing train under model_parallel")
def test_tp2_on_two_gpus(tmp_path, cuda_reference):
    tp2 = {"dp": 1, "tp": 2}
    got = _launch(tmp_path, 2, [{"name": "tp2", **tp2}, {"name": "bf16_mixed", **tp2, "precision": "bf16-mixed"},
                                {"name": "fsdp_bf16", **tp2, "fsdp_bf16": True},
                                {"name": "recompute", **tp2, "recompute": True}])
    assert got["tp2"]["mesh"] == (("data_parallel", "tensor_parallel"), (1, 2))
    assert_close(got["tp2"]["weights"], cuda_reference["weights"], ATOL)
    assert_close(got["recompute"]["weights"], cuda_reference["weights"], ATOL)
    assert got["recompute"]["attention_calls"] == 2 * script.STEPS
    for name, stored in (("bf16_mixed", {"torch.float32"}), ("fsdp_bf16", {"torch.float32"})):
        assert got[name]["param_dtypes"] == stored and got[name]["logits_dtype"] == "torch.bfloat16"
        assert got[name]["losses"] == pytest.approx(cuda_reference["losses"], abs=0.01)


@needs_cuda(4, "TP2xDP2 and TP4 over nccl equal one GPU")
@pytest.mark.parametrize(("dp", "tp"), [(2, 2), (1, 4)])
def test_four_gpus_equal_one(tmp_path, cuda_reference, dp, tp):
    got = _launch(tmp_path, 4, [{"name": "run", "dp": dp, "tp": tp}])["run"]
    assert got["mesh"] == (("data_parallel", "tensor_parallel"), (dp, tp))
    assert_close(got["weights"], cuda_reference["weights"], ATOL)
    assert got["losses"] == pytest.approx(cuda_reference["losses"], abs=ATOL)
