"""torch.compile'd models under ddp and fsdp (2 ranks over gloo), with Fleet and with the Trainer.

They train as one process would with the global batch, save under the model's own names (no
``_orig_mod.``), and load our checkpoints and ones saved from a compiled module. The script
compiles with a counting backend that runs dynamo's captured graphs as they are (like
``backend="eager"``): inductor's code generation would take minutes on CI's CPUs, and what is
checked here is where the compiled wrapper sits, not the generated code.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.distributed.sharded_helpers import ROOT, child_env
from tests.distributed.test_ddp import assert_same_weights
from tests.distributed.test_fleet_ddp import one_process_reference

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fleet_compiled.py")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_compiled_models_train_save_and_load_under_their_own_names(tmp_path, strategy):
    proc = subprocess.run([sys.executable, SCRIPT, strategy, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env=child_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-6000:]
    result = torch.load(tmp_path / "result.pt", weights_only=False)
    want = {f"net.{k}": v for k, v in one_process_reference().items()}

    # dynamo captured the training path in both clients (the compiled wrapper was called, not bypassed)
    assert result["fleet_graphs"] >= 1 and result["trainer_graphs"] >= 1
    assert_same_weights(result["fleet_weights"], want, atol=1e-5)
    assert_same_weights(result["trainer_weights"], want, atol=1e-5)
    # the model's own names in what Fleet and the Trainer wrote, and in FleetModule.state_dict()
    assert result["fleet_saved_keys"] == sorted(want) == sorted(result["fleet_weights"])
    assert result["trainer_saved_keys"] == sorted(want)
    # a fresh compiled model loads both our checkpoint and names saved from a compiled module
    assert_same_weights(result["loaded"], result["fleet_weights"], atol=0)
    assert_same_weights(result["loaded_old"], result["fleet_weights"], atol=0)
