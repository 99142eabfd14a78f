"""The Lightning docs' custom DDP strategy (configure_ddp, precision_plugin=) trained on 2 real processes over gloo.

scripts/custom_ddp_train.py holds the example as the docs write it (imports rewritten); it is run as
a script, as the docs' DDPStrategy defaults (strategy "ddp": the script is re-run for rank 1) need.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.distributed.test_ddp import ROOT, assert_same_weights, reference
from torchfleet.errors import ConfigurationError
from torchfleet.precision import Precision
from torchfleet.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, SingleDeviceStrategy

pytestmark = [pytest.mark.distributed]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "custom_ddp_train.py")


def _pythonpath() -> str:
    """The repository root (tests.*) first, then what the caller put on PYTHONPATH (a checkout's src, if any)."""
    return os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))


def test_docs_custom_ddp_strategy_is_used_and_matches_one_process(tmp_path):
    out = tmp_path / "result.pt"
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, SCRIPT, json.dumps({"out": str(out)})], capture_output=True, text=True,
                          timeout=120, env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": _pythonpath()}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = torch.load(out)
    # each rank built the docs' DDP once, kept it as strategy.model and ran its training steps through it
    steps = result["global_step"]
    assert [r[0] for r in result["per_rank"]] == [0, 1]
    for rank, built, forwards, is_custom in result["per_rank"]:
        assert (built, is_custom) == (1, 1), f"rank {rank}"
        assert forwards == steps, f"rank {rank}: {forwards} forwards through the custom DDP, {steps} steps"
    assert result["precision_is_plugin"]
    want = reference(batch=16)
    assert steps == want["global_step"]
    assert_same_weights(result["weights"], want["weights"], atol=1e-6)


@pytest.mark.parametrize("cls", [DDPStrategy, FSDPStrategy, SingleDeviceStrategy])
def test_precision_plugin_is_lightnings_name_for_precision(cls):
    plugin = Precision()
    strategy = cls(precision_plugin=plugin)
    assert strategy.precision is plugin and strategy.has_part("precision")
    assert strategy.precision_plugin is plugin  # the docs' custom strategy reads self.precision_plugin
    with pytest.raises(ConfigurationError, match="precision_plugin is Lightning's name for precision"):
        cls(precision=Precision(), precision_plugin=plugin)


def test_trainer_precision_plugin_is_the_strategys_precision():
    from torchfleet import Trainer

    plugin = Precision()
    trainer = Trainer(accelerator="cpu", strategy=SingleDeviceStrategy(precision_plugin=plugin), logger=False)
    assert trainer.precision_plugin is plugin is trainer.strategy.precision


def test_deepspeed_takes_precision_plugin_too():
    import inspect

    assert "precision_plugin" in inspect.signature(DeepSpeedStrategy).parameters
