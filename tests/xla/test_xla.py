"""XLAStrategy on XLA's CPU backend (PJRT_DEVICE=CPU): both forms against CPU references, checkpoints across.

Needs torch_xla (2.9.0, on torch 2.9): scripts/xla_lane.sh builds that environment and runs this folder. Elsewhere
(CI, the project's own environment) every test here is skipped with the reason. Each run is a process of its own
(tests/xla/xla_program.py): XLA's device count is fixed when its runtime starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.xla,
    pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None,
                       reason="torch_xla is not installed (torch_xla 2.9 needs torch 2.9; scripts/xla_lane.sh builds "
                              "that environment and runs tests/xla)"),
]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOLERANCE = 1e-6
#: the differences measured, written where scripts/xla_lane.sh asks (XLA_LANE_FIGURES) for its summary
FIGURES: dict[str, float] = {}


def run(tmp: str, name: str, xla_devices: int = 1, **spec) -> dict:
    """Run xla_program.py with ``spec`` on ``xla_devices`` XLA CPU devices; its results."""
    import torch

    out = os.path.join(tmp, f"{name}.pt")
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(xla_devices),
           "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), ROOT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "xla_program.py"), json.dumps({**spec, "out": out})],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return torch.load(out, weights_only=True)


def largest_difference(a: dict, b: dict, label: str = "") -> float:
    assert a["weights"].keys() == b["weights"].keys()
    found = max((a["weights"][k] - b["weights"][k]).abs().max().item() for k in a["weights"])
    if label:
        FIGURES[label] = found
    return found


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    yield str(tmp_path_factory.mktemp("xla"))
    if os.environ.get("XLA_LANE_FIGURES"):
        with open(os.environ["XLA_LANE_FIGURES"], "w") as f:
            json.dump(FIGURES, f, indent=1)


@pytest.fixture(scope="module")
def references(tmp) -> dict:
    """CPU runs of 6 steps: one process (the SPMD reference) and ddp over 2 ranks (the launch reference)."""
    return {"cpu": run(tmp, "cpu", strategy="single_device", steps=6),
            "ddp": run(tmp, "ddp", strategy="ddp_spawn", devices=2, steps=6, save=os.path.join(tmp, "ddp6.ckpt"))}


def test_spmd_two_devices_equal_one_device(tmp, references):
    two = run(tmp, "spmd2", xla_devices=2, strategy="spmd", devices=2, steps=6)
    one = run(tmp, "spmd1", xla_devices=1, strategy="spmd", devices=1, steps=6)
    assert two["global_step"] == one["global_step"] == 6
    assert largest_difference(two, one, "spmd 2 devices vs 1 device") < TOLERANCE
    assert largest_difference(two, references["cpu"], "spmd 2 devices vs CPU single_device") < TOLERANCE
    # the logged loss (sync_dist=True) is the whole batch's, as in one process
    for key in ("train_loss_step", "train_loss_epoch"):
        assert abs(two["metrics"][key] - references["cpu"]["metrics"][key]) < TOLERANCE, key
    # the weights moved: the comparison is not between untouched initialisations
    assert largest_difference(two, run(tmp, "spmd2_1step", xla_devices=2, strategy="spmd", devices=2, steps=1)) > 1e-3


def test_launch_two_replicas_equal_ddp(tmp, references):
    launched = run(tmp, "launch2", xla_devices=2, strategy="launch", devices=2, steps=6)
    assert launched["global_step"] == 6
    assert largest_difference(launched, references["ddp"], "launch 2 replicas vs ddp 2 ranks") < TOLERANCE
    for key in ("train_loss_step", "train_loss_epoch"):  # self.log(sync_dist=True): the mean over the replicas
        assert abs(launched["metrics"][key] - references["ddp"]["metrics"][key]) < TOLERANCE, key


def test_launch_one_device_equals_one_process(tmp, references):
    one = run(tmp, "launch1", xla_devices=1, strategy="launch", devices=1, steps=6)
    assert largest_difference(one, references["cpu"], "launch 1 device vs CPU single_device") < TOLERANCE


def test_spmd_checkpoint_resumes_on_cpu_and_back(tmp, references):
    first = run(tmp, "spmd_3", xla_devices=2, strategy="spmd", devices=2, steps=3, save=os.path.join(tmp, "spmd3.ckpt"))
    # written on the host: every tensor of the module and the optimizer on the CPU
    assert first["checkpoint"] == {"devices": ["cpu"], "global_step": 3, "optimizer_devices": ["cpu"]}
    on_cpu = run(tmp, "cpu_from_spmd", strategy="single_device", steps=6, resume=os.path.join(tmp, "spmd3.ckpt"))
    assert largest_difference(on_cpu, references["cpu"], "spmd ckpt -> CPU resume vs CPU") < TOLERANCE
    run(tmp, "cpu_3", strategy="single_device", steps=3, save=os.path.join(tmp, "cpu3.ckpt"))
    on_xla = run(tmp, "spmd_from_cpu", xla_devices=2, strategy="spmd", devices=2, steps=6,
                 resume=os.path.join(tmp, "cpu3.ckpt"))
    assert on_xla["global_step"] == 6
    assert largest_difference(on_xla, references["cpu"], "CPU ckpt -> spmd resume vs CPU") < TOLERANCE


def test_launch_checkpoint_resumes_under_ddp_and_back(tmp, references):
    first = run(tmp, "launch_3", xla_devices=2, strategy="launch", devices=2, steps=3,
                save=os.path.join(tmp, "launch3.ckpt"))
    assert first["checkpoint"] == {"devices": ["cpu"], "global_step": 3, "optimizer_devices": ["cpu"]}
    under_ddp = run(tmp, "ddp_from_launch", strategy="ddp_spawn", devices=2, steps=6,
                    resume=os.path.join(tmp, "launch3.ckpt"))
    assert largest_difference(under_ddp, references["ddp"], "launch ckpt -> ddp resume vs ddp") < TOLERANCE
    run(tmp, "ddp_3", strategy="ddp_spawn", devices=2, steps=3, save=os.path.join(tmp, "ddp3.ckpt"))
    launched = run(tmp, "launch_from_ddp", xla_devices=2, strategy="launch", devices=2, steps=6,
                   resume=os.path.join(tmp, "ddp3.ckpt"))
    assert largest_difference(launched, references["ddp"], "ddp ckpt -> launch resume vs ddp") < TOLERANCE


def test_bf16_true_trains_in_bfloat16(tmp, references):
    half = run(tmp, "spmd_bf16", xla_devices=2, strategy="spmd", devices=2, steps=6, precision="bf16-true")
    assert half["dtype"] == "torch.bfloat16"
    full = references["cpu"]["metrics"]["train_loss_epoch"]
    # bfloat16 keeps ~3 significant digits: the same run, not the same numbers
    assert abs(half["metrics"]["train_loss_epoch"] - full) < 0.05 * full
    assert largest_difference(half, references["cpu"], "spmd bf16-true vs CPU 32-true") < 0.05
