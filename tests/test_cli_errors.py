"""The command line's bad input (YAML, option values a class's own checks reject) as one paragraph with exit code 2,
and `fit --help` showing the defaults that apply."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from torch import nn

from tests.test_cli import TinyClassifier
from tests.test_user_cli import run as run_user_script
from torchfleet.cli import _run_stage, main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = "tests.test_cli_errors"
TINY = ["--data=tests.test_cli.TinyData", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


class PickyClassifier(TinyClassifier):
    """TinyClassifier that checks its own argument, as user models do.

    Args:
        width: hidden width, at least 1.
    """

    def __init__(self, width: int = 4):
        if width < 1:
            raise ValueError(f"width must be at least 1, got {width}")
        super().__init__()
        self.hidden = nn.Linear(4, width)


def one_paragraph(text: str) -> str:
    text = text.strip()
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def test_invalid_yaml_says_where(tmp_path, capsys):
    bad = tmp_path / "run.yaml"
    bad.write_text("trainer:\n  max_epochs: 2\nmodel: [1\n")
    assert main(["fit", f"--config={bad}"]) == 2
    err = one_paragraph(capsys.readouterr().err)
    assert f"--config {str(bad)!r} is not valid YAML" in err and "line 4, column 1" in err


def test_a_value_the_example_data_rejects(capsys):
    assert main(["fit", "--data.batch_size=0"]) == 2
    err = one_paragraph(capsys.readouterr().err)
    assert "AdditionData(batch_size=0) is not valid: give an int >= 1" in err


def test_a_value_the_example_model_rejects(capsys):
    assert main(["fit", "--model.nhead=5"]) == 2
    err = one_paragraph(capsys.readouterr().err)
    assert "AdditionTransformer(d_model=64, nhead=5) is not valid" in err and "nhead must divide d_model" in err


def test_a_value_the_users_model_rejects_names_the_class_values_and_place(tmp_path, capsys):
    code = main(["fit", f"--model={HERE}.PickyClassifier", "--model.width=0", *TINY,
                 f"--trainer.default_root_dir={tmp_path}"])
    assert code == 2
    err = one_paragraph(capsys.readouterr().err)
    assert "--model PickyClassifier(width=0) could not be built from the values given" in err
    assert "ValueError: width must be at least 1, got 0" in err
    assert f"raised at {os.path.abspath(__file__)}:" in err and "in __init__" in err


def test_trainer_errors_from_the_command_line(tmp_path, capsys):
    base = ["fit", f"--model={HERE}.PickyClassifier", *TINY, f"--trainer.default_root_dir={tmp_path}"]
    assert main([*base, "--trainer.logger=csv"]) == 2
    assert "logger='csv' is not valid" in one_paragraph(capsys.readouterr().err)
    assert main([*base, "--trainer.min_epochs=3", "--trainer.max_epochs=2"]) == 2
    assert "min_epochs=3 is more than max_epochs=2" in one_paragraph(capsys.readouterr().err)


def test_the_command_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "run.yaml"
    bad.write_text("trainer: {max_epochs: 2\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    for args in (["--config", str(bad)], ["--data.batch_size=0"]):
        proc = subprocess.run([sys.executable, "-m", "torchfleet", "fit", *args], capture_output=True, text=True,
                              cwd=tmp_path, env=env, timeout=120)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert lines[:-1] in ([], ["Seed set to 0"]), proc.stderr  # the seed, logged before the objects are built
        assert one_paragraph(lines[-1]).startswith("torchfleet fit: error: ")


def test_cli_in_a_users_script(tmp_path):
    (tmp_path / "bad.yaml").write_text("model:\n  hidden: [1\n")
    proc, report = run_user_script(tmp_path, "fit", "--config", "bad.yaml")
    assert proc.returncode == 2 and report is None
    assert "--config 'bad.yaml' is not valid YAML" in one_paragraph(proc.stderr)
    proc, report = run_user_script(tmp_path, "fit", "--trainer.min_steps=9", "--trainer.max_steps=3")
    assert proc.returncode == 2 and report is None
    assert "min_steps=9 is more than max_steps=3" in one_paragraph(proc.stderr)


def _help_defaults(text: str, names: tuple[str, ...]) -> dict[str, str]:
    """The "default: X" that `--help` shows for each --trainer.NAME."""
    flat = " ".join(text.split())
    shown = {}
    for name in names:
        segment = flat.split(f" --trainer.{name} ", 1)[1].split(" --", 1)[0]
        found = re.search(r"default: ([^)]*)\)\s*$", segment)
        assert found, segment
        shown[name] = found.group(1)
    return shown


NAMES = ("log_every_n_steps", "max_epochs", "precision", "num_sanity_val_steps")


@pytest.mark.parametrize("model_args", [[], [f"--model={HERE}.PickyClassifier", "--data=tests.test_cli.TinyData"]],
                         ids=["bundled example", "a model of ours"])
def test_fit_help_shows_the_defaults_that_apply(model_args, capsys):
    assert main(["fit", *model_args, "--help"]) == 0
    shown = _help_defaults(capsys.readouterr().out, NAMES)
    sink: dict = {}
    assert _run_stage("fit", list(model_args), sink=sink, run=False) == 0
    trainer = sink["trainer"]
    assert shown == {name: str(getattr(trainer, name)) for name in NAMES}
    if not model_args:  # the bundled example's own settings are what its help shows
        from torchfleet.examples.addition import default_trainer_kwargs

        assert int(shown["max_epochs"]) == default_trainer_kwargs()["max_epochs"]
