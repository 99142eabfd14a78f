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

from tests.distributed.test_ddp import ROOT, assert_same_weights, pythonpath, reference
from torchfleet.errors import ConfigurationError
from torchfleet.precision import Precision
from torchfleet.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, SingleDeviceStrategy

pytestmark = [pytest.mark.distributed]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "custom_ddp_train.py")


def _run(tmp_path, strategy: str) -> dict:
    out = tmp_path / f"{strategy}.pt"
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, SCRIPT, json.dumps({"out": str(out), "strategy": strategy})],
                          capture_output=True, text=True, timeout=120,
                          env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = torch.load(out)
    result["ranks"] = [dict(zip(result["columns"], row)) for row in result["per_rank"]]
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    return result


def test_docs_custom_ddp_strategy_is_used_and_matches_one_process(tmp_path):
    result = _run(tmp_path, "docs")
    steps = result["global_step"]
    for seen in result["ranks"]:
        rank = seen["rank"]
        # the docs' setup(self, trainer) ran once, its super().setup built the docs' DDP around the Module itself
        # (Lightning's configure_ddp sees the LightningModule) and kept it as strategy.model while training ran
        assert (seen["setup"], seen["module_in_configure_ddp"], seen["built"]) == (1, 1, 1), f"rank {rank}"
        assert seen["custom_during_fit"] == 1, f"rank {rank}"
        assert seen["forwards"] == steps, f"rank {rank}: {seen['forwards']} forwards through the custom DDP, {steps} steps"
        # teardown at the end of fit unwrapped it: strategy.model is the Module again (as in Lightning)
        assert seen["unwrapped_after"] == 1, f"rank {rank}"
    assert result["precision_is_plugin"]
    want = reference(batch=16)
    assert steps == want["global_step"]
    assert_same_weights(result["weights"], want["weights"], atol=1e-6)


def test_a_strategy_that_calls_the_closure_itself_matches_one_process(tmp_path):
    """optimizer_step(optimizer, closure) that runs closure() and then optimizer.step() (hivemind's, colossalai's
    shape): training_step and backward run inside the closure, once per step, and training equals one process."""
    result = _run(tmp_path, "closure")
    steps = result["global_step"]
    for seen in result["ranks"]:
        assert seen["closure_calls"] == seen["optimizer_steps"] == steps, seen
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
