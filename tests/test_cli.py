"""The torchfleet command: registry listing, fit from flags and YAML, errors as one paragraph with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from torchfleet.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
         "--trainer.num_sanity_val_steps=0"]


def test_strategies_table_in_a_subprocess():
    out = subprocess.run([sys.executable, "-m", "torchfleet", "strategies"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["name", "class", "description"]
    assert any(line.startswith("single_device") and "SingleDeviceStrategy" in line for line in lines)


def test_accelerators_and_version(capsys):
    assert main(["accelerators"]) == 0
    out = capsys.readouterr().out
    assert "cuda" in out and "CPUAccelerator" in out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("torchfleet ")


def test_help_and_unknown_command(capsys):
    assert main(["--help"]) == 0
    assert "strategies" in capsys.readouterr().out
    assert main(["fitt"]) == 2
    assert "Did you mean 'fit'" in capsys.readouterr().err


def test_fit_from_flags_writes_metrics(tmp_path, capsys):
    code = main(["fit", "--model=tests.helpers.Regressor", "--model.hidden=7", "--data=tests.helpers.RegressionData",
                 "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path}", *QUIET])
    assert code == 0
    out = capsys.readouterr().out
    assert "Finished: epoch 2, step 16" in out
    assert os.path.isfile(tmp_path / "logs" / "version_0" / "metrics.csv")
    with open(tmp_path / "logs" / "version_0" / "hparams.yaml") as f:
        assert yaml.safe_load(f)["hidden"] == 7
    assert (tmp_path / "logs" / "version_0" / "loss_curve.png").is_file()


def test_config_file_and_flag_precedence(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"class_path": "tests.helpers.Regressor", "init_args": {"hidden": 5}},
        "data": {"class_path": "tests.helpers.RegressionData"},
        "trainer": {"max_epochs": 3, "default_root_dir": str(tmp_path), "logger": False, "enable_checkpointing": False},
    }))
    assert main(["fit", f"--config={config}", "--trainer.max_epochs=1", *QUIET]) == 0
    assert "Finished: epoch 1, step 8" in capsys.readouterr().out  # the flag beat the file's max_epochs=3


def test_print_config_round_trips(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["fit", "--model=tests.helpers.Regressor", "--model.lr=0.5", "--trainer.max_epochs=4", "--print_config"])
    assert info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["max_epochs"] == 4
    assert printed["model"]["class_path"] == "tests.helpers.Regressor"
    assert printed["model"]["init_args"]["lr"] == 0.5


def test_example_is_the_default_model(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"] == "torchfleet.examples.addition.AdditionTransformer"
    assert printed["data"]["class_path"] == "torchfleet.examples.addition.AdditionData"
    assert printed["trainer"]["max_epochs"] == 3


def test_unknown_class_path_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["fit", "--model=tests.helpers.NoSuchModel"])
    assert info.value.code == 2
    assert "tests.helpers.NoSuchModel" in capsys.readouterr().err


def test_library_errors_are_one_paragraph(capsys):
    code = main(["fit", "--model=tests.helpers.Regressor", "--data=tests.helpers.RegressionData", "--trainer.strategy=single_devce"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("torchfleet fit: error: Unknown strategy 'single_devce'")
    assert "Did you mean 'single_device'" in err and "Traceback" not in err and "\n" not in err
