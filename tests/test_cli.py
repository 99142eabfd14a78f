"""The torchfleet command: registry listing, fit from flags and YAML, errors as one paragraph with exit code 2."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchfleet import DataModule, Module
from torchfleet.cli import _metric_rows, _plot, main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
         "--trainer.num_sanity_val_steps=0"]
HERE = "tests.test_cli"


class TinyClassifier(Module):
    """Two-class logistic regression that logs train_loss, val_loss and val_acc."""

    def __init__(self, d_in: int = 4, lr: float = 0.5, explode: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(d_in, 2)

    def training_step(self, batch, batch_idx):
        if self.hparams.explode:
            raise RuntimeError("boom from training_step")
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(out, y))
        self.log("val_acc", (out.argmax(-1) == y).float().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self.net(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class TinyData(DataModule):
    """Points labelled by the sign of their first coordinate."""

    def __init__(self, n: int = 32, batch_size: int = 8):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, 4, generator=g)
        self.dataset = TensorDataset(x, (x[:, 0] > 0).long())
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.dataset, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.dataset, batch_size=self.batch_size)


def tiny(tmp_path, *extra: str) -> list[str]:
    return ["fit", f"--model={HERE}.TinyClassifier", f"--data={HERE}.TinyData", "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2", "--trainer.log_every_n_steps=1", f"--trainer.default_root_dir={tmp_path}", *QUIET, *extra]


def one_paragraph_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err
    return err


# ---------------------------------------------------------------- commands without a model

def test_strategies_table_in_a_subprocess():
    out = subprocess.run([sys.executable, "-m", "torchfleet", "strategies"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if not line.startswith("[")]  # not the notes under it
    assert lines[0].split() == ["name", "class", "usable", "description"]
    assert any(line.split()[:3] == ["single_device", "SingleDeviceStrategy", "yes"] for line in lines[1:])
    # aligned: every row's class and usable columns start where the header's do
    for name in ("class", "usable"):
        column = lines[0].index(name)
        assert all(line[column - 2 : column] == "  " and line[column] != " " for line in lines[1:])


def test_accelerators_and_version(capsys):
    from torchfleet.accelerators.registry import AcceleratorRegistry

    assert main(["accelerators"]) == 0
    out = capsys.readouterr().out
    for entry in AcceleratorRegistry.entries():
        assert any(line.split()[:2] == [entry.name, entry.cls.__name__] for line in out.splitlines())
    assert main(["--version"]) == 0
    import torchfleet

    assert capsys.readouterr().out.strip() == f"torchfleet {torchfleet.__version__}"


def test_help_lists_every_command_and_unknown_command_suggests(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("fit", "validate", "test", "predict", "strategies", "accelerators"):
        assert any(line.split()[:1] == [command] for line in out.splitlines()), command
    assert main(["fitt"]) == 2
    assert "Did you mean 'fit'" in capsys.readouterr().err
    assert main([]) == 2


# ---------------------------------------------------------------- running a model

def test_fit_tiny_model_writes_metrics_plot_and_reports(tmp_path, capsys):
    assert main(tiny(tmp_path)) == 0
    out = capsys.readouterr().out
    log_dir = tmp_path / "logs" / "version_0"
    rows, columns = _metric_rows(str(log_dir))  # TensorBoard's event files, or metrics.csv without tensorboard
    assert {"train_loss", "val_acc", "step", "epoch"} <= set(columns)
    assert max(int(r["step"]) for r in rows) == 1  # limit_train_batches=2, one epoch: steps 0 and 1, as Lightning
    pytest.importorskip("matplotlib")
    assert (log_dir / "loss_curve.png").stat().st_size > 1000
    report = [line for line in out.splitlines() if str(log_dir) in line]
    assert len(report) == 1
    checkpoint = report[0].rsplit("best checkpoint: ", 1)[1]
    assert os.path.isfile(checkpoint) and checkpoint.endswith(".ckpt")


def test_fit_from_flags_passes_model_arguments(tmp_path, capsys):
    code = main(["fit", "--model=tests.helpers.Regressor", "--model.hidden=7", "--data=tests.helpers.RegressionData",
                 "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path}", *QUIET])
    assert code == 0
    assert "Finished: epoch 2, step 16" in capsys.readouterr().out  # 64 samples / batch 8 = 8 steps per epoch
    with open(tmp_path / "logs" / "version_0" / "hparams.yaml") as f:
        assert yaml.safe_load(f)["hidden"] == 7


def test_config_file_and_flag_precedence(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"class_path": "tests.helpers.Regressor", "init_args": {"hidden": 5}},
        "data": {"class_path": "tests.helpers.RegressionData"},
        "trainer": {"max_epochs": 3, "default_root_dir": str(tmp_path), "logger": False, "enable_checkpointing": False},
    }))
    assert main(["fit", f"--config={config}", "--trainer.max_epochs=1", *QUIET]) == 0
    assert "Finished: epoch 1, step 8" in capsys.readouterr().out  # the flag beat the file's max_epochs=3
    assert main(["fit", "--config", str(config), *QUIET]) == 0
    assert "Finished: epoch 3, step 24" in capsys.readouterr().out  # without the flag the file's value holds


def test_print_config_round_trips(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"seed_everything": 5, "trainer": {"max_epochs": 9, "max_steps": 40}}))
    code = main(["fit", f"--config={config}", f"--model={HERE}.TinyClassifier", "--model.lr=0.25",
                 "--trainer.max_epochs=4", "--seed", "7", "--print_config"])
    assert code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["max_epochs"] == 4 and printed["trainer"]["max_steps"] == 40
    assert printed["seed_everything"] == 7
    assert printed["model"]["class_path"] == f"{HERE}.TinyClassifier"
    assert printed["model"]["init_args"]["lr"] == 0.25
    # what --print_config writes is a config that --config reads back to the same values
    saved = tmp_path / "saved.yaml"
    saved.write_text(yaml.safe_dump(printed))
    assert main(["fit", f"--config={saved}", "--print_config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == printed


def test_example_is_the_default_model(tmp_path, capsys):
    from torchfleet.examples import addition

    assert main(["fit", "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"] == "torchfleet.examples.addition.AdditionTransformer"
    assert printed["data"]["class_path"] == "torchfleet.examples.addition.AdditionData"
    for key, value in addition.default_trainer_kwargs().items():
        assert printed["trainer"][key] == value
    # a config whose model section has init_args but no class still tunes the example
    config = tmp_path / "example.yaml"
    config.write_text(yaml.safe_dump({"model": {"init_args": {"digits": 4}}}))
    assert main(["fit", f"--config={config}", "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"].endswith("addition.AdditionTransformer")
    assert printed["model"]["init_args"]["digits"] == 4


def test_file_form_class_path(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "pkgdir").mkdir()
    (tmp_path / "pkgdir" / "cli_file_model.py").write_text(
        f"from {HERE} import TinyClassifier, TinyData\n\n\nclass FileModel(TinyClassifier):\n    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--model=pkgdir/cli_file_model.py:FileModel", "--data", "pkgdir/cli_file_model.py:TinyData",
                 "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"] == "pkgdir.cli_file_model.FileModel"
    assert printed["data"]["class_path"] == "pkgdir.cli_file_model.TinyData"
    args = tiny(tmp_path)
    args[1:3] = ["--model=pkgdir/cli_file_model.py:FileModel", f"--data={HERE}.TinyData"]
    assert main(args) == 0
    assert _metric_rows(str(tmp_path / "logs" / "version_0"))


def test_test_stage_from_a_checkpoint(tmp_path, capsys):
    assert main(tiny(tmp_path)) == 0
    checkpoint = capsys.readouterr().out.rsplit("best checkpoint: ", 1)[1].strip()
    args = tiny(tmp_path, f"--ckpt_path={checkpoint}")
    args[0] = "test"
    assert main(args) == 0
    rows, _ = _metric_rows(str(tmp_path / "logs" / "version_1"))  # the test run's own log folder
    assert [r["test_acc"] for r in rows if r.get("test_acc")]


def test_plot_without_matplotlib_logs_how_to_enable_it(tmp_path, monkeypatch, caplog):
    (tmp_path / "metrics.csv").write_text("step,train_loss,epoch\n1,0.5,0\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    logger = logging.getLogger("torchfleet")
    logger.addHandler(caplog.handler)  # the torchfleet logger may not propagate to the root
    try:
        with caplog.at_level(logging.INFO, logger="torchfleet"):
            assert _plot(str(tmp_path)) is None
    finally:
        logger.removeHandler(caplog.handler)
    assert "pip install matplotlib" in caplog.text
    assert not (tmp_path / "loss_curve.png").exists()


def test_plot_from_a_metrics_file(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "metrics.csv").write_text(
        "step,train_loss,epoch,val_loss,val_acc\n2,0.9,0,,\n4,0.7,0,0.8,0.5\n6,0.5,1,,\n8,0.4,1,0.45,0.75\n"
    )
    assert _plot(str(tmp_path)) == str(tmp_path / "loss_curve.png")
    assert (tmp_path / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "empty").mkdir()
    assert _plot(str(tmp_path / "empty")) is None  # no metrics.csv: nothing to draw


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize(
    ("given", "why"),
    [("tests.helpers.NoSuchModel", "has no attribute 'NoSuchModel'"),
     ("no_such_package_xyz.Model", "No module named 'no_such_package_xyz'")],
)
def test_unknown_class_path_is_one_paragraph_exit_2(given, why, capsys):
    assert main(["fit", f"--model={given}"]) == 2
    err = one_paragraph_error(capsys)
    assert repr(given) in err and "could not be imported" in err and why in err
    assert "'package.module.ClassName'" in err


def test_class_that_is_not_a_module_and_bad_class_in_config(tmp_path, capsys):
    assert main(["fit", "--model", "torch.nn.Linear"]) == 2
    err = one_paragraph_error(capsys)
    assert "'torch.nn.Linear'" in err and "torchfleet.Module" in err
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model": f"{HERE}.TinyClassifier", "data": {"class_path": f"{HERE}.NoData"}}))
    assert main(["fit", f"--config={config}"]) == 2
    err = one_paragraph_error(capsys)
    assert f"'{HERE}.NoData'" in err and "could not be imported" in err


def test_unknown_strategy_gives_the_library_error(tmp_path, capsys):
    from torchfleet import Trainer
    from torchfleet.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as expected:
        Trainer(strategy="dpp")  # the CLI's Trainer: accelerator "auto" (dp is suggested only where CUDA is)
    assert main(tiny(tmp_path, "--trainer.strategy=dpp")) == 2
    err = one_paragraph_error(capsys)
    assert err == f"torchfleet fit: error: {' '.join(str(expected.value).split())}"
    assert "Unknown strategy 'dpp'" in err


def test_missing_checkpoint_is_a_library_error(tmp_path, capsys):
    assert main(tiny(tmp_path, f"--ckpt_path={tmp_path / 'nope.ckpt'}")) == 2
    assert "nope.ckpt" in one_paragraph_error(capsys)


def test_other_exceptions_propagate(tmp_path):
    with pytest.raises(RuntimeError, match="boom from training_step"):
        main(tiny(tmp_path, "--model.explode=true"))
