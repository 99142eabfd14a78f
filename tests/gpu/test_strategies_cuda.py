"""Strategies on CUDA devices: train, save and resume at 1 GPU; match one process with the global batch at 2+.

The runs reuse tests/distributed/scripts/fsdp_train.py (the gloo tests' script) with
``"accelerator": "cuda"``: a small transformer whose global batch is the same at every world
size, so every strategy must end with the weights of one process on one GPU (fp32, within 1e-5).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.distributed import sharded_helpers
from tests.distributed.scripts import fsdp_train
from tests.distributed.scripts.fsdp_train import SAVE_AT, STEPS, build
from tests.distributed.sharded_helpers import ROOT, assert_close, child_env, load_results, train_reference
from tests.gpu.conftest import cuda_count, needs_cuda
from torchfleet.checkpoint.deepspeed import deepspeed_available

SCRIPT = fsdp_train.__file__
ATOL = 1e-5
WRAP = {"auto_wrap": True}


@pytest.fixture(scope="module")
def cuda_reference() -> dict:
    """One process on one GPU with the global batch."""
    return train_reference(build, accelerator="cuda")


def _launch(tmp_path, devices: int, runs: list[dict], timeout: float = 600) -> dict:
    cfg = {"accelerator": "cuda", "devices": devices, "runs": runs, "out": str(tmp_path / "results.pt")}
    return load_results(cfg, sharded_helpers.run_script(SCRIPT, cfg, timeout))


def _save_and_resume(name: str, strategy: str, ckpt_dir: str, **extra) -> list[dict]:
    return [{"name": name, "strategy": strategy, "save_at": SAVE_AT, "ckpt_dir": ckpt_dir, **extra},
            {"name": f"{name}_resumed", "strategy": strategy, "resume": os.path.join(ckpt_dir, f"{name}.ckpt"),
             **extra}]


def _check_trained_and_resumed(results: dict, name: str, reference: dict, backend: str | None) -> None:
    straight, resumed = results[name], results[f"{name}_resumed"]
    assert straight["global_step"] == resumed["global_step"] == STEPS
    assert_close(straight["weights"], reference["weights"], ATOL)
    assert_close(resumed["weights"], straight["weights"], ATOL)
    if backend is not None:
        assert straight["backend"] == backend


@needs_cuda(1, "ddp, dp and fsdp on one GPU train, save and resume")
def test_ddp_dp_fsdp_on_one_gpu_train_save_and_resume(tmp_path, cuda_reference):
    d = str(tmp_path)
    runs = [*_save_and_resume("ddp", "ddp", d), *_save_and_resume("dp", "dp", d),
            *_save_and_resume("fsdp", "fsdp", d, fsdp=WRAP)]
    results = _launch(tmp_path, 1, runs)
    _check_trained_and_resumed(results, "ddp", cuda_reference, "nccl")
    _check_trained_and_resumed(results, "dp", cuda_reference, None)
    _check_trained_and_resumed(results, "fsdp", cuda_reference, "nccl")


@needs_cuda(1, "DeepSpeed on one GPU trains, saves and resumes")
@pytest.mark.skipif(not deepspeed_available(), reason="deepspeed is not installed (the 'deepspeed' extra)")
def test_deepspeed_on_one_gpu_trains_saves_and_resumes(tmp_path, cuda_reference):
    d = str(tmp_path)
    results = _launch(tmp_path, 1, [*_save_and_resume("ds2", "deepspeed_stage_2", d),
                                    *_save_and_resume("ds3", "deepspeed_stage_3", d)])
    _check_trained_and_resumed(results, "ds2", cuda_reference, "nccl")
    _check_trained_and_resumed(results, "ds3", cuda_reference, "nccl")


@needs_cuda(2, "ddp and fsdp across 2 GPUs match one process with the global batch, over nccl")
def test_ddp_and_fsdp_on_two_gpus_match_one_process(tmp_path, cuda_reference):
    d = str(tmp_path)
    runs = [*_save_and_resume("ddp", "ddp", d), *_save_and_resume("fsdp", "fsdp", d, fsdp=WRAP),
            {"name": "fsdp_whole", "strategy": "fsdp"}]
    results = _launch(tmp_path, 2, runs)
    _check_trained_and_resumed(results, "ddp", cuda_reference, "nccl")
    _check_trained_and_resumed(results, "fsdp", cuda_reference, "nccl")
    assert_close(results["fsdp_whole"]["weights"], cuda_reference["weights"], ATOL)
    assert results["fsdp"]["world_size"] == 2
    sharded = results["fsdp"]["params"]
    assert all(p["dtensor"] for p in sharded.values())
    # rank 0 holds about half of the weights
    assert sum(p["local_numel"] for p in sharded.values()) < 0.6 * sum(p["numel"] for p in sharded.values())


@needs_cuda(2, "DeepSpeed ZeRO 1/2/3 across 2 GPUs match one process with the global batch")
@pytest.mark.skipif(not deepspeed_available(), reason="deepspeed is not installed (the 'deepspeed' extra)")
def test_deepspeed_stages_on_two_gpus_match_one_process(tmp_path, cuda_reference):
    d = str(tmp_path)
    runs = [{"name": "ds1", "strategy": "deepspeed_stage_1"}, *_save_and_resume("ds2", "deepspeed_stage_2", d),
            *_save_and_resume("ds3", "deepspeed_stage_3", d)]
    results = _launch(tmp_path, 2, runs)
    assert_close(results["ds1"]["weights"], cuda_reference["weights"], ATOL)
    _check_trained_and_resumed(results, "ds2", cuda_reference, "nccl")
    _check_trained_and_resumed(results, "ds3", cuda_reference, "nccl")


@needs_cuda(4, "HYBRID_SHARD on a 2x2 mesh of GPUs matches one process")
def test_fsdp_hybrid_shard_on_a_two_by_two_mesh(tmp_path, cuda_reference):
    runs = [{"name": "hybrid", "strategy": "fsdp",
             "fsdp": {**WRAP, "sharding_strategy": "HYBRID_SHARD", "device_mesh": [2, 2]}}]
    results = _launch(tmp_path, 4, runs)
    assert results["hybrid"]["world_size"] == 4
    assert_close(results["hybrid"]["weights"], cuda_reference["weights"], ATOL)


@needs_cuda(2, "ddp_spawn across 2 GPUs matches one process and fills the caller's model")
def test_ddp_spawn_on_two_gpus_matches_one_process(cuda_reference):
    import torchfleet as tf

    tf.seed_everything(0)
    model, trainer, train, val = build("ddp_spawn", 2, accelerator="cuda")
    trainer.fit(model, train, val)
    assert trainer.global_step == STEPS
    assert_close({k: v.float() for k, v in model.state_dict().items()}, cuda_reference["weights"], ATOL)


@needs_cuda(1, "the devices find_usable_cuda_devices returns can be trained on")
def test_find_usable_cuda_devices():
    from torchfleet.accelerators import find_usable_cuda_devices
    from torchfleet.errors import ConfigurationError

    every = find_usable_cuda_devices(-1)
    assert every and set(every) <= set(range(cuda_count()))
    assert find_usable_cuda_devices(1) == every[:1]
    for i in every:
        torch.ones(1, device=torch.device("cuda", i))
    with pytest.raises(ConfigurationError, match="visible"):
        find_usable_cuda_devices(cuda_count() + 1)


_FORK_AFTER = """
import torch
from tests.distributed.scripts.ddp_train import build
from torchfleet.errors import ConfigurationError
{before}
model, trainer, train, val = build({{"strategy": "ddp_fork", "devices": 2}})
try:
    trainer.fit(model, train, val)
except ConfigurationError as exc:
    print("REFUSED:", exc)
else:
    print("NOT REFUSED")
"""


@needs_cuda(1, "ddp_fork is refused once CUDA or autograd's device threads run in the notebook")
@pytest.mark.parametrize("before, expected", [
    ("torch.zeros(1, device='cuda')", "CUDA was already initialised"),
    # a CPU backward on a machine with a GPU starts autograd's device threads: forked ranks could not backward
    ("torch.nn.Linear(2, 1)(torch.ones(1, 2)).sum().backward()", "autograd started its device threads"),
], ids=["cuda-initialised", "cpu-backward"])
def test_ddp_fork_is_refused_up_front_on_a_gpu_machine(before, expected):
    code = _FORK_AFTER.format(before=before)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=child_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "REFUSED:" in proc.stdout and expected in proc.stdout, proc.stdout
