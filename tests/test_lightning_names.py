"""Every public name of Lightning's LightningModule, LightningDataModule, Trainer and Fabric exists on torchfleet's
Module, DataModule, Trainer and Fleet, except the deliberate absences below, each with its reason.

Lightning's names are the committed list tests/lightning_names.json (so CI without Lightning checks them);
where the reference Lightning is installed, the list is checked against it (tests/lightning_names.py writes it).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import torchfleet as tf
from tests.lightning_reference import LIGHTNING_PYTHON, needs_lightning

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = os.path.join(HERE, "lightning_names.json")

_HPARAMS_ENTRIES = "checkpoints keep the hyperparameters as given, without Lightning's hparams name and type entries"
_ZERO_LENGTH = "torchfleet never refuses an empty dataloader on several devices, so there is nothing to allow"
_REMOVE_IGNORED = "Lightning's internal helper of save_hyperparameters (ignore= does its work here)"

#: Lightning's name -> why torchfleet's class does not have it
ABSENT: dict[str, dict[str, str]] = {
    "LightningModule": {
        "CHECKPOINT_HYPER_PARAMS_NAME": _HPARAMS_ENTRIES,
        "CHECKPOINT_HYPER_PARAMS_TYPE": _HPARAMS_ENTRIES,
        "allow_zero_length_dataloader_with_multiple_devices": _ZERO_LENGTH,
        "remove_ignored_hparams": _REMOVE_IGNORED,
        "on_validation_model_zero_grad": "the fit loop does not release gradients before validation (no hook); "
                                         "they are zeroed before the next step as always",
        "to_tensorrt": "needs torch_tensorrt and CUDA; compile to_torchscript()'s result with torch_tensorrt",
    },
    "LightningDataModule": {
        "CHECKPOINT_HYPER_PARAMS_NAME": _HPARAMS_ENTRIES,
        "CHECKPOINT_HYPER_PARAMS_TYPE": _HPARAMS_ENTRIES,
        "allow_zero_length_dataloader_with_multiple_devices": _ZERO_LENGTH,
        "remove_ignored_hparams": _REMOVE_IGNORED,
        "load_from_checkpoint": "checkpoints do not keep a DataModule's hyperparameters yet (Lightning's "
                                "datamodule_hyper_parameters entry); build the DataModule with its arguments",
    },
    "Trainer": {
        "enable_autolog_hparams": "hyperparameters from save_hyperparameters() are always logged; "
                                  "save_hyperparameters(logger=False) keeps them out",
        "val_check_batch": "Lightning's loop-internal count of batches between validations",
    },
    "Fabric": {
        "load_raw": "fleet.load reads torchfleet checkpoints; load a plain state dict with load_state_dict",
        "run": "Lightning's subclass-and-override entry point: write the loop as a function, fleet.launch(fn)",
        "sharded_model": "Lightning's deprecated alias of init_module",
    },
}


class _Model(tf.Module):
    pass


def _ours() -> dict[str, object]:
    return {"LightningModule": _Model(), "LightningDataModule": tf.DataModule(),
            "Trainer": tf.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False),
            "Fabric": tf.Fleet(accelerator="cpu", devices=1)}


def _names(obj: object) -> set[str]:
    # class attributes and the instance's own, without reading them (some properties raise outside a run)
    return set(dir(type(obj))) | set(vars(obj))


@pytest.fixture(scope="module")
def lightning_names() -> dict:
    with open(NAMES) as f:
        return json.load(f)


@pytest.mark.parametrize("kind", sorted(ABSENT))
def test_every_lightning_name_exists_or_is_explained(lightning_names, kind):
    have = _names(_ours()[kind])
    missing = sorted(set(lightning_names[kind]) - have - set(ABSENT[kind]))
    assert not missing, f"{kind} names torchfleet lacks, neither added nor explained in ABSENT: {missing}"
    present = sorted(set(ABSENT[kind]) & have)
    assert not present, f"{kind}: ABSENT lists names torchfleet has now (remove them there): {present}"
    assert set(ABSENT[kind]) <= set(lightning_names[kind]), "ABSENT names something Lightning does not have"


@needs_lightning
def test_the_committed_list_is_the_installed_lightnings(lightning_names):
    out = subprocess.run([LIGHTNING_PYTHON, os.path.join(HERE, "lightning_names.py")], capture_output=True,
                         text=True, timeout=240, check=True).stdout
    assert json.loads(out) == lightning_names, (
        f"Lightning's names changed: regenerate with `{LIGHTNING_PYTHON} tests/lightning_names.py > "
        "tests/lightning_names.json`, then add or explain the new ones")
