"""Programs written as public Lightning/Fabric programs are (tests/ported/programs*.py), compared with Lightning.

Each mode runs every program in one launch (tests/ported/parity.py): one process, ddp on 2 processes, fsdp on 2.
torchfleet's single-process and ddp results must equal Lightning's: within 1e-5 (relative) of the fixture that
tools/record_lightning_ported.py recorded under Lightning (so CI, which has no Lightning, compares too; the
tolerance absorbs another CPU's rounding), and bitwise where the reference Lightning is installed and runs the
same programs (their import lines turned back) live. Lightning cannot run fsdp on a CPU: there each program must
end within 2e-5 of torchfleet's ddp run, which splits the data and re-seeds as fsdp does.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.lightning_reference import LIGHTNING_PYTHON, needs_lightning
from tests.ported import parity

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

#: what absorbs another CPU's rounding (relative, plus an absolute floor for values near zero)
FIXTURE_RTOL, FIXTURE_ATOL = 1e-5, 1e-6
#: fsdp against ddp: the same data and seeds, sharded arithmetic
FSDP_ATOL = 2e-5

#: where torchfleet differs from Lightning on purpose (docs/porting.md, "Porting a LightningModule")
DELIBERATE: dict = {}
#: differences being fixed on another branch: strict, so the merge that fixes them must remove the entry
PENDING: dict = {}


def _cases(mode: str) -> list:
    """Every program Lightning runs in ``mode``, less the deliberate differences; pending ones strictly xfail."""
    cases = []
    for name in parity.programs_for(mode, lightning=True):
        if (name, mode) in DELIBERATE:
            continue
        reason = PENDING.get((name, mode))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        cases.append(pytest.param(name, id=name, marks=marks))
    return cases


class Runs:
    """One library's launches, one per mode, made when a test first needs them (``python``: Lightning's)."""

    def __init__(self, factory, python: str | None = None) -> None:
        self.factory, self.python, self.results, self.folders = factory, python, {}, {}

    def __call__(self, mode: str) -> dict:
        if mode not in self.results:
            self.folders[mode] = str(self.factory.mktemp(mode))
            self.results[mode] = parity.launch(mode, self.folders[mode], python=self.python)
        return self.results[mode]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory)


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory, python=LIGHTNING_PYTHON)


def _fixture(mode: str) -> dict:
    return torch.load(parity.fixture_path(mode), weights_only=True)


def test_programs_did_what_they_mean(runs):
    """The single-process runs did what the programs mean: each feature left its mark."""
    single = runs("single")
    transformer = single["transformer"]
    # the warm-up scheduler stepped in optimizer_step once per optimizer step (2 epochs x 4 batches)
    assert transformer["scheduler_steps"] == transformer["global_step"] == 8 and transformer["lr"] > 0
    assert single["gan"]["global_step"] == 2 * 4 * 2  # two optimizer steps per batch, 4 batches, 2 epochs
    assert 0.0 <= single["classifier"]["metrics"]["val/acc_best"] <= 1.0
    assert single["classifier"]["hparams"] == {"lr": 0.05}
    assert single["autoencoder"]["datamodule_hparams"] == {"batch_size": 16}
    assert single["autoencoder"]["test_loss"] > 0
    # the replay buffer's iterable gives episode_length / batch_size batches an epoch, 3 epochs
    assert single["dqn"]["global_step"] == 3 * 32 // 8
    assert single["language_model"]["global_step"] == 2 * 3  # limit_train_batches=3, 2 epochs
    kfold = single["fleet:kfold"]
    assert len(kfold["val_losses"]) == 2 * 3 and all(0.0 <= a <= 1.0 for a in kfold["epoch_accuracies"])
    assert {k.split(".")[0] for k in kfold["weights"]} == {"fold0", "fold1", "fold2"}


def test_fabric_programs_wrote_their_files_under_ddp(runs):
    runs("ddp")
    folder = runs.folders["ddp"]
    assert os.path.exists(os.path.join(folder, "root", "classifier.ckpt"))
    logs = [f for _, _, files in os.walk(os.path.join(folder, "root", "fleet_logs")) for f in files]
    assert "metrics.csv" in logs


@pytest.mark.parametrize("name", _cases("single"))
def test_single_process_equals_lightnings_recorded_results(runs, name):
    assert parity.differences(runs("single")[name], _fixture("single")[name], FIXTURE_RTOL, FIXTURE_ATOL) == []


@pytest.mark.parametrize("name", _cases("ddp"))
def test_ddp_equals_lightnings_recorded_results(runs, name):
    assert parity.differences(runs("ddp")[name], _fixture("ddp")[name], FIXTURE_RTOL, FIXTURE_ATOL) == []


@pytest.mark.parametrize("name", parity.programs_for("fsdp"))
def test_fsdp_equals_ddp(runs, name):
    assert parity.differences(runs("fsdp")[name], runs("ddp")[name], atol=FSDP_ATOL) == []


@needs_lightning
@pytest.mark.parametrize("name", _cases("single"))
def test_single_process_equals_live_lightning_bitwise(runs, lightning_runs, name):
    assert parity.differences(runs("single")[name], lightning_runs("single")[name]) == []


@needs_lightning
@pytest.mark.parametrize("name", _cases("ddp"))
def test_ddp_equals_live_lightning_bitwise(runs, lightning_runs, name):
    assert parity.differences(runs("ddp")[name], lightning_runs("ddp")[name]) == []


@needs_lightning
@pytest.mark.parametrize("mode", ["single", "ddp"])
def test_recorded_results_are_lightnings_for_these_programs(lightning_runs, mode):
    """The fixture was recorded from the programs as they are now (re-record after changing one)."""
    recorded = {k: v for k, v in _fixture(mode).items() if k != "_meta"}
    assert parity.differences(lightning_runs(mode), recorded, FIXTURE_RTOL, FIXTURE_ATOL) == []
