"""LightningCLI programs ported by their imports (cli_autoencoder.py, cli_classifier.py), run as users run them.

Each program runs as a real process (``python cli_autoencoder.py fit ...``): fit, --print_config and --config,
validate --ckpt_path, 2 processes under ddp; run=False and dict arguments run in this process. Where the
reference Lightning is installed (``TORCHFLEET_LIGHTNING_PYTHON``, default /work/venv-lightning/bin/python), the
same programs with their imports turned back to Lightning run under it: config.yaml must hold the same sections
and values (the Trainer's arguments compared where both Trainers have them) and the final weights must be
bitwise equal, on one process and under ddp.
"""

from __future__ import annotations

import functools
import glob
import math
import os
import pickle
import subprocess
import sys

import pytest
import torch
import yaml

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIGHTNING_PYTHON = os.environ.get("TORCHFLEET_LIGHTNING_PYTHON", "/work/venv-lightning/bin/python")

#: the program's import lines and the Lightning originals they were ported from
PORTED_IMPORTS = {
    "from torchfleet import Callback": "from lightning.pytorch import Callback",
    "from torchfleet import DataModule as LightningDataModule": "from lightning.pytorch import LightningDataModule",
    "from torchfleet import Module as LightningModule": "from lightning.pytorch import LightningModule",
    "from torchfleet.callbacks import ModelCheckpoint": "from lightning.pytorch.callbacks import ModelCheckpoint",
    "from torchfleet.cli import LightningCLI": "from lightning.pytorch.cli import LightningCLI",
}
#: Lightning Trainer arguments torchfleet's Trainer does not have (docs/porting.md)
LIGHTNING_ONLY_TRAINER_ARGS = {"detect_anomaly", "barebones", "reload_dataloaders_every_n_epochs",
                               "enable_autolog_hparams", "model_registry"}
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.default_root_dir=runs"]
CLASSIFIER_ARGS = ["--model=LitClassifier", "--model.init_args.backbone.hidden_dim=12", "--optimizer=SGD",
                   "--optimizer.lr=0.2", "--lr_scheduler=StepLR", "--lr_scheduler.step_size=1",
                   "--trainer.max_epochs=2", *QUIET]
DDP = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu"]


#: prints whether Lightning's cli module is installed, found without importing Lightning (which takes seconds)
_FIND_CLI = ("import importlib.util, os; s = importlib.util.find_spec('lightning'); "
             "print(s is not None and os.path.isfile(os.path.join(s.submodule_search_locations[0], 'pytorch', 'cli.py')))")


@functools.cache  # one probe per session, not one per use
def _lightning_available() -> bool:
    if not os.path.isfile(LIGHTNING_PYTHON):
        return False
    found = subprocess.run([LIGHTNING_PYTHON, "-c", _FIND_CLI], capture_output=True, text=True, env=_env(True))
    return found.returncode == 0 and found.stdout.strip() == "True"


def _env(lightning: bool = False) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")  # the same threads in both, for bitwise comparisons
    for var in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
        env.pop(var, None)
    if lightning:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "src"), ROOT, env.get("PYTHONPATH")) if p)
    return env


def _program(name: str, folder: str, lightning: bool = False) -> str:
    """Copy the program into ``folder`` (its imports turned back to Lightning's for the reference run)."""
    with open(os.path.join(HERE, name)) as f:
        source = f.read()
    if lightning:
        for ours, theirs in PORTED_IMPORTS.items():
            source = source.replace(f"\n{ours}\n", f"\n{theirs}\n")
        assert "import torchfleet" not in source and "from torchfleet" not in source
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(source)
    return path


def _run(name: str, args: list[str], folder: str, lightning: bool = False) -> subprocess.CompletedProcess:
    python = LIGHTNING_PYTHON if lightning else sys.executable
    proc = subprocess.run([python, _program(name, folder, lightning), *args], capture_output=True, text=True,
                          cwd=folder, env=_env(lightning), timeout=280)
    return proc


def _config(folder: str, version: int = 0) -> dict:
    found = glob.glob(os.path.join(folder, "runs", "*", f"version_{version}", "config.yaml"))
    assert len(found) == 1, found
    with open(found[0]) as f:
        return yaml.safe_load(f)


def _checkpoints(folder: str) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, "runs", "**", "*.ckpt"), recursive=True))


def _weights(path: str, lightning: bool = False) -> dict[str, torch.Tensor]:
    """A checkpoint's state_dict. Lightning's is read here when it holds only plain values and tensors (a weights-only
    load: these programs' checkpoints do, without starting Lightning's Python), else by Lightning's Python (its
    pickles name Lightning's classes)."""
    if not lightning:
        return torch.load(path, weights_only=False)["state_dict"]
    try:
        return torch.load(path, weights_only=True)["state_dict"]
    except pickle.UnpicklingError:
        pass
    out = path + ".state_dict.pt"
    code = "import sys, torch; torch.save(torch.load(sys.argv[1], weights_only=False)['state_dict'], sys.argv[2])"
    subprocess.run([LIGHTNING_PYTHON, "-c", code, path, out], check=True, env=_env(True))
    return torch.load(out, weights_only=True)


def _same_config(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for section in ours:
        if section != "trainer":
            assert ours[section] == theirs[section], section
    shared = ours["trainer"].keys() & theirs["trainer"].keys()

    def form(key: str, value: object) -> object:
        # Lightning types devices list[int] | str | int and so reads --trainer.devices=2 as the string '2'; ours
        # reads the int 2: either Trainer takes either
        return str(value) if key == "devices" else value

    assert ({k: form(k, ours["trainer"][k]) for k in shared}
            == {k: form(k, theirs["trainer"][k]) for k in shared})
    assert theirs["trainer"].keys() - ours["trainer"].keys() <= LIGHTNING_ONLY_TRAINER_ARGS


def _bitwise_equal(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    different = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert not different, f"weights differ from Lightning's in {different}"


needs_lightning = pytest.mark.skipif(not _lightning_available(),
                                     reason=f"the reference Lightning ({LIGHTNING_PYTHON}) is not installed")


# ---------------------------------------------------------------------------- the autoencoder, as a process
@pytest.fixture(scope="module")
def autoencoder_fit(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("autoencoder"))
    proc = _run("cli_autoencoder.py", ["fit", "--model.hidden_dim=12", *QUIET], folder)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return folder


def test_autoencoder_fit_writes_its_configuration_and_checkpoint(autoencoder_fit):
    config = _config(autoencoder_fit)
    assert config["seed_everything"] == 1234  # seed_everything_default
    assert config["model"] == {"hidden_dim": 12, "learning_rate": 0.01}
    assert config["trainer"]["max_epochs"] == 2  # trainer_defaults
    assert config["data"] == {"batch_size": 8, "size": 96}
    steps = 2 * math.ceil((96 - 32) / 8)
    assert [os.path.basename(p) for p in _checkpoints(autoencoder_fit)] == [f"epoch=1-step={steps}.ckpt"]


def test_validate_builds_the_model_from_the_checkpoint_hyperparameters(autoencoder_fit):
    """validate --ckpt_path without --model.hidden_dim: the width saved in the checkpoint (12, not the default
    16) builds the model, or its weights would not load."""
    ckpt = _checkpoints(autoencoder_fit)[0]
    proc = _run("cli_autoencoder.py", ["validate", f"--ckpt_path={ckpt}", *QUIET], autoencoder_fit)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "val_loss" in proc.stdout + proc.stderr  # the metrics table
    assert _config(autoencoder_fit, version=1)["model"]["hidden_dim"] == 12


@needs_lightning
def test_autoencoder_matches_lightning(autoencoder_fit, tmp_path):
    proc = _run("cli_autoencoder.py", ["fit", "--model.hidden_dim=12", *QUIET], str(tmp_path), lightning=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _same_config(_config(autoencoder_fit), _config(str(tmp_path)))
    [theirs] = _checkpoints(str(tmp_path))
    [ours] = _checkpoints(autoencoder_fit)
    assert os.path.basename(ours) == os.path.basename(theirs)
    _bitwise_equal(_weights(ours), _weights(theirs, lightning=True))


# ---------------------------------------------------------------------------- the classifier, as a process
@pytest.fixture(scope="module")
def classifier_fit(tmp_path_factory) -> str:
    """--print_config of a command line, then fit from that file alone."""
    folder = str(tmp_path_factory.mktemp("classifier"))
    printed = _run("cli_classifier.py", ["fit", *CLASSIFIER_ARGS, "--print_config"], folder)
    assert printed.returncode == 0, printed.stderr[-4000:]
    with open(os.path.join(folder, "printed.yaml"), "w") as f:
        f.write(printed.stdout)
    proc = _run("cli_classifier.py", ["fit", "--config=printed.yaml"], folder)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return folder


def test_a_printed_configuration_runs_again(classifier_fit):
    with open(os.path.join(classifier_fit, "printed.yaml")) as f:
        printed = yaml.safe_load(f)
    saved = _config(classifier_fit)
    assert saved == printed
    assert saved["model"]["class_path"] == "__main__.LitClassifier"
    assert saved["model"]["init_args"]["backbone"]["init_args"]["hidden_dim"] == 12
    assert saved["optimizer"]["class_path"] == "torch.optim.SGD"
    assert saved["checkpoint"]["monitor"] == "val_loss"  # add_arguments_to_parser's set_defaults
    names = sorted(os.path.basename(p) for p in _checkpoints(classifier_fit))
    assert names == ["best-epoch=1.ckpt", "last.ckpt"] or names == ["best-epoch=0.ckpt", "last.ckpt"]
    state = torch.load(os.path.join(os.path.dirname(_checkpoints(classifier_fit)[0]), "last.ckpt"),
                       weights_only=False)
    # the command line's SGD and StepLR trained it: no Adam moments, lr stepped down once per epoch
    assert "exp_avg" not in state["optimizer_states"][0]["state"].get(0, {})
    assert state["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(0.2 * 0.1 ** 2)


def test_validate_rebuilds_the_backbone_recorded_in_the_checkpoint(classifier_fit):
    """The backbone's width (12) was a nested class argument: not a hyperparameter (save_hyperparameters ignores
    it), but recorded in the checkpoint with the configuration, so validate builds a model its weights fit."""
    last = [p for p in _checkpoints(classifier_fit) if p.endswith("last.ckpt")][0]
    proc = _run("cli_classifier.py", ["validate", "--model=LitClassifier", f"--ckpt_path={last}", *QUIET],
                classifier_fit)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "val_acc" in proc.stdout + proc.stderr
    backbone = _config(classifier_fit, version=1)["model"]["init_args"]["backbone"]
    assert backbone["init_args"]["hidden_dim"] == 12


@needs_lightning
def test_classifier_matches_lightning(classifier_fit, tmp_path):
    proc = _run("cli_classifier.py", ["fit", *CLASSIFIER_ARGS], str(tmp_path), lightning=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _same_config(_config(classifier_fit), _config(str(tmp_path)))
    ours = [p for p in _checkpoints(classifier_fit) if p.endswith("last.ckpt")][0]
    theirs = [p for p in _checkpoints(str(tmp_path)) if p.endswith("last.ckpt")][0]
    _bitwise_equal(_weights(ours), _weights(theirs, lightning=True))


@pytest.mark.distributed
def test_classifier_under_ddp_on_two_processes(tmp_path):
    ours = str(tmp_path / "ours")
    proc = _run("cli_classifier.py", ["fit", *CLASSIFIER_ARGS, *DDP], ours)
    assert proc.returncode == 0, proc.stderr[-4000:]
    config = _config(ours)  # one folder, written by rank 0
    assert (config["trainer"]["strategy"], config["trainer"]["devices"]) == ("ddp", 2)
    assert not glob.glob(os.path.join(ours, "runs", "*", "version_1"))
    last = [p for p in _checkpoints(ours) if p.endswith("last.ckpt")]
    assert len(last) == 1
    if not _lightning_available():
        pytest.skip(f"ran under ddp; the reference Lightning ({LIGHTNING_PYTHON}) is not installed to compare")
    theirs = str(tmp_path / "lightning")
    proc = _run("cli_classifier.py", ["fit", *CLASSIFIER_ARGS, *DDP], theirs, lightning=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _same_config(config, _config(theirs))
    their_last = [p for p in _checkpoints(theirs) if p.endswith("last.ckpt")][0]
    _bitwise_equal(_weights(last[0]), _weights(their_last, lightning=True))


@pytest.mark.distributed
def test_classifier_under_ddp_spawn_pickles_the_cli_parts(tmp_path):
    """ddp_spawn pickles the Trainer's callbacks (SaveConfigCallback holds its parser) and the model (its
    configure_optimizers built from --optimizer) for the ranks it starts."""
    proc = _run("cli_classifier.py", ["fit", *CLASSIFIER_ARGS, "--trainer.max_epochs=1", "--trainer.strategy=ddp_spawn",
                                      "--trainer.devices=2", "--trainer.accelerator=cpu"], str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _config(str(tmp_path))["trainer"]["strategy"] == "ddp_spawn"
    last = [p for p in _checkpoints(str(tmp_path)) if p.endswith("last.ckpt")][0]
    groups = torch.load(last, weights_only=False)["optimizer_states"][0]["param_groups"]
    assert groups[0]["lr"] == pytest.approx(0.2 * 0.1) and groups[0]["momentum"] == 0  # SGD, stepped once


def test_command_line_errors_end_with_one_paragraph_and_status_2(tmp_path):
    proc = _run("cli_autoencoder.py", ["fit", "--trainer.max_epochs=-5", *QUIET], str(tmp_path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert line.startswith("cli_autoencoder.py: error: max_epochs=-5")
    proc = _run("cli_classifier.py", ["fit", "--model=nosuch.Classifier", *QUIET], str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--model 'nosuch.Classifier' could not be imported" in proc.stderr
