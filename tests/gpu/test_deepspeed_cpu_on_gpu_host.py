"""accelerator="cpu" under DeepSpeed on a machine with a GPU: the engine and the parameters stay on the CPU.

DeepSpeed selects its CUDA accelerator by itself when it finds a GPU; before torchfleet selected
DeepSpeed's CPU accelerator for CPU runs, one process failed with "Expected all tensors to be on
the same device" (weights on cuda:0) and two with "CUDA error: invalid device ordinal". Each case
is one real launch of the DeepSpeed test script (gloo), training ZeRO-2 for a few steps.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.distributed import sharded_helpers
from tests.gpu.conftest import needs_cuda
from torchfleet.checkpoint.deepspeed import deepspeed_available

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.distributed,
    needs_cuda(1, "checks that accelerator='cpu' keeps DeepSpeed on the CPU"),
    pytest.mark.skipif(not deepspeed_available(), reason="deepspeed is not installed (the 'deepspeed' extra)"),
]

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "distributed", "scripts", "deepspeed_train.py")


@pytest.mark.parametrize("devices", [1, 2])
def test_deepspeed_with_accelerator_cpu_trains_on_the_cpu(tmp_path, devices):
    cfg = {"out": str(tmp_path / "out.pt"), "devices": devices, "runs": [
        {"name": "cpu", "strategy": "deepspeed_stage_2", "max_steps": 3},
    ]}
    result = sharded_helpers.load_results(cfg, sharded_helpers.run_script(SCRIPT, cfg, timeout=300))["cpu"]
    assert result["world_size"] == devices and result["global_step"] == 3
    assert result["ds_accelerator"] == "cpu"
    assert result["engine_device"] == "cpu"
    assert result["param_devices"] == ["cpu"]
    assert all(w.device.type == "cpu" and torch.isfinite(w).all() for w in result["weights"].values())
