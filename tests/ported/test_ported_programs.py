"""Programs written as public Lightning/Fabric programs are, under single_device, ddp and fsdp on CPU.

The reference is each program run in this process on one device with the whole global batch (for Trainer
programs, each step's samples those the 2 shuffling ranks read: programs.train_loader); the same program on 2
processes (half the batch each) must end with the same weights and metrics.
A program that silently skipped a feature (an optimizer_step override, a gradient sync through a method
that is not forward, a torchmetrics object) would end elsewhere.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.distributed.sharded_helpers import assert_close, run_script
from tests.ported import programs
from tests.ported.run_programs import trainer_kwargs

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "run_programs.py")
ATOL = 2e-5
TRAINER = list(programs.TRAINER_PROGRAMS)
FLEET = [f"fleet:{name}" for name in programs.FLEET_PROGRAMS]


def _reference(name: str, root: str) -> dict:
    if name.startswith("fleet:"):
        import torchfleet as tf

        fleet = tf.Fleet(accelerator="cpu", devices=1)
        return programs.FLEET_PROGRAMS[name.split(":", 1)[1]](fleet, root)
    return programs.summarise(programs.TRAINER_PROGRAMS[name](trainer_kwargs("single_device", 1, root), 1))


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict:
    root = str(tmp_path_factory.mktemp("reference"))
    return {name: _reference(name, root) for name in TRAINER + FLEET}


def _launch(strategy: str, names: list[str], tmp_path) -> dict:
    cfg = {"strategy": strategy, "programs": names, "out": str(tmp_path / "out.pt"), "root": str(tmp_path)}
    proc = run_script(SCRIPT, cfg, timeout=300)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return torch.load(cfg["out"], weights_only=False)


def _compare(got: dict, want: dict) -> None:
    assert_close(got["weights"], want["weights"], ATOL)
    for key, value in want.items():
        if key == "weights":
            continue
        if key == "metrics":
            assert got["metrics"].keys() == value.keys()
            for name, v in value.items():
                assert got["metrics"][name] == pytest.approx(v, abs=1e-5), name
        elif isinstance(value, float):
            assert got[key] == pytest.approx(value, abs=1e-5), key
        else:
            assert got[key] == value, key


def test_references_trained(references):
    """The single-process runs did what the programs mean: each feature left its mark."""
    transformer = references["transformer"]
    # the warm-up scheduler stepped in optimizer_step once per optimizer step (2 epochs x 4 batches)
    assert transformer["scheduler_steps"] == transformer["global_step"] == 8 and transformer["lr"] > 0
    gan = references["gan"]
    assert gan["global_step"] == 2 * 4 * 2  # two optimizer steps per batch, 4 batches, 2 epochs
    assert 0.0 <= references["classifier"]["metrics"]["val/acc_best"] <= 1.0
    assert references["classifier"]["hparams"] == {"lr": 0.05}
    assert references["autoencoder"]["datamodule_hparams"] == {"batch_size": 16}
    assert references["autoencoder"]["test_loss"] > 0


def test_trainer_programs_under_ddp(references, tmp_path):
    got = _launch("ddp", TRAINER, tmp_path)
    for name in TRAINER:
        want = dict(references[name])
        if name == "autoencoder":
            want["datamodule_hparams"] = {"batch_size": 8}  # per-rank batch
        _compare(got[name], want)


def test_trainer_programs_under_fsdp(references, tmp_path):
    names = ["autoencoder", "transformer", "gan", "classifier"]
    got = _launch("fsdp", names, tmp_path)
    for name in names:
        want = dict(references[name])
        if name == "autoencoder":
            want["datamodule_hparams"] = {"batch_size": 8}
        _compare(got[name], want)


def test_fleet_programs_under_ddp(references, tmp_path):
    got = _launch("ddp", FLEET, tmp_path)
    for name in FLEET:
        _compare(got[name], references[name])
    assert os.path.exists(tmp_path / "classifier.ckpt")
    logs = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / "fleet_logs") for f in files]
    assert any(f.endswith("metrics.csv") for f in logs)
