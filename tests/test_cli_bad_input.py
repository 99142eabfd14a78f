"""Bad input at every `torchfleet` command, as a user types it: an unknown flag, a value of the wrong type, zero,
negative and huge numbers, a missing file, a directory where a file is expected, empty data. Each ends in one
paragraph on stderr (after `torchfleet COMMAND: error:`) and exit status 2, as argparse's usage errors do.

The command runs through its main() function (capsys reads what it printed); one subprocess checks the exit status a
shell sees. Nothing here starts a training process: every case is refused before."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader

from torchfleet import DataModule
from torchfleet.cli import main
from torchfleet.planner import choose

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = "tests.test_cli_bad_input"
#: fit's options for a small run on the CPU (the bundled example's model)
CPU = ["--trainer.accelerator=cpu", "--trainer.logger=false"]


class NoRows(DataModule):
    """Training data with no batch: 3 samples, batch_size 4, drop_last."""

    def train_dataloader(self):
        return DataLoader([torch.randn(4) for _ in range(3)], batch_size=4, drop_last=True)


def error_of(capsys, command: str) -> str:
    """The one paragraph the command printed on stderr, without its `torchfleet COMMAND: error: ` prefix."""
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    prefix = f"torchfleet {command}: error: " if command else "torchfleet: error: "
    assert err.startswith(prefix), err
    return err[len(prefix):]


LISTING = [
    (["strategies", "--bogus"], "unrecognized arguments: --bogus. `torchfleet strategies` takes no arguments"),
    (["strategies", "--explain=yes"], "'--explain=yes' is not valid: --explain takes no value"),
    (["strategies", "ddp"], "unrecognized arguments: ddp."),
    (["accelerators", "--all"], "unrecognized arguments: --all. `torchfleet accelerators` takes no arguments."),
]


@pytest.mark.parametrize(("argv", "words"), LISTING, ids=[" ".join(a) for a, _ in LISTING])
def test_the_listings_refuse_arguments_they_do_not_take(argv, words, capsys):
    assert main(argv) == 2
    assert words in error_of(capsys, argv[0])


def test_the_listings_help_and_unknown_commands(capsys):
    assert main(["strategies", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: torchfleet strategies") and "--explain" in out
    assert main(["accelerators", "-h"]) == 0
    assert capsys.readouterr().out.startswith("usage: torchfleet accelerators")
    assert main(["strategy"]) == 2
    message = error_of(capsys, "")
    assert message.startswith("unknown command 'strategy'. Did you mean 'strategies'?") and "consolidate" in message
    assert main(["--version", "--bogus"]) == 2
    assert error_of(capsys, "") == "unrecognized arguments: --bogus. `torchfleet --version` takes none."


SIZES = [
    ("1e30", "is 9.09e+17 TiB"),
    ("0", "is not more than 0 bytes"),
    ("-5GiB", "is not more than 0 bytes"),
    ("80", "is 80 bytes"),
    ("80TB", "is 72.8 TiB"),
    ("eighty", "is not a size: give a number and a unit"),
]


@pytest.mark.parametrize(("size", "words"), SIZES, ids=[s for s, _ in SIZES])
def test_estimate_refuses_sizes_no_device_has(size, words, capsys):
    assert main(["estimate", *CPU, "--device-memory", size]) == 2
    message = error_of(capsys, "estimate")
    assert message.startswith(f"--device-memory {size!r} {words}"), message
    assert "e.g. 80GiB" in message
    if size == "80":  # a number without its unit
        assert message.endswith("Did you mean 80GiB?")


def test_the_sizes_at_the_ends_of_the_range_are_accepted():
    assert choose.parse_size("1MiB") == choose.SMALLEST_DEVICE == 2**20
    assert choose.parse_size("16TiB") == choose.LARGEST_DEVICE
    for outside in ("1023KiB", "16.01TiB"):
        with pytest.raises(ValueError, match="between 1 MiB and 16 TiB"):
            choose.parse_size(outside)


def test_estimate_on_empty_training_data_says_so(capsys):
    assert main(["estimate", *CPU, f"--data={HERE}.NoRows", "--device-memory", "80GiB"]) == 2
    message = error_of(capsys, "estimate")
    assert message.startswith("The training data is empty: the DataLoader over a dataset of 3 samples yields no "
                              "batch"), message
    assert main(["strategies", "--explain", *CPU, "--trainer.devices=2", f"--data={HERE}.NoRows"]) == 2
    assert error_of(capsys, "strategies").startswith("The training data is empty")


USAGE = [
    (["--bogus"], "unrecognized arguments: --bogus. `torchfleet fit --help` lists the options."),
    (["--trainer.max_epochs=abc"], "--trainer.max_epochs 'abc' is not accepted: expected int or None."),
    (["--trainer.max_steps=1e30"], "--trainer.max_steps '1e+30' is not accepted: expected int."),
    (["--seed", "abc"], "--seed_everything 'abc' is not accepted: expected int or None."),
    (["--trainer.max_epochs"], "argument --trainer.max_epochs: expected one argument."),
    (["--config", "missing.yaml"], "--config is not accepted: File does not exist:"),
    (["--config", "."], "--config is not accepted: Path is not a file:"),
    (["--model", "tests"], "--model 'tests' is not accepted: expected Module or None. Give it as a dotted import path"),
]


@pytest.mark.parametrize(("argv", "words"), USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_fits_usage_errors_are_one_paragraph(argv, words, capsys):
    assert main(["fit", *argv]) == 2
    message = error_of(capsys, "fit")
    assert message.startswith(words), message


def test_values_the_trainer_refuses_and_numbers_too_large_for_the_machine(tmp_path, capsys):
    assert main(["fit", *CPU, "--trainer.max_epochs=-5"]) == 2
    assert error_of(capsys, "fit") == "max_epochs=-5 is not valid: it must be an int >= 0."
    assert main(["fit", *CPU, "--trainer.devices=1000000"]) == 2
    message = error_of(capsys, "fit")
    assert message.startswith(f"devices=1000000 is not valid for the CPU: 1000000 processes on a machine with "
                              f"{os.cpu_count()} cores is more than torchfleet starts on one node (at most "
                              f"{max(64, 4 * os.cpu_count())}")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("a file where a folder is expected")
    assert main(["fit", *CPU, f"--trainer.default_root_dir={a_file}"]) == 2
    assert error_of(capsys, "fit") == (f"default_root_dir={str(a_file)!r} is not valid: it is a file, not a folder; "
                                       "give the folder for logs and checkpoints (made if it does not exist), or None "
                                       "for the current directory.")
    assert main(["validate", *CPU, "--trainer.limit_val_batches=-1"]) == 2
    assert error_of(capsys, "validate").startswith("limit_val_batches=-1 is not valid")


def test_consolidate_checks_its_paths_before_reading_or_writing(tmp_path, capsys):
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"not read: every case below is refused before")
    cases = [
        ([str(tmp_path / "missing.ckpt"), str(tmp_path / "out.ckpt")], "does not exist; give the path of a checkpoint"),
        ([str(ckpt), str(tmp_path)], f"OUT {str(tmp_path)!r} is a directory; give the path of the file to write"),
        ([str(ckpt), str(tmp_path / "no" / "out.ckpt")], f"its folder {str(tmp_path / 'no')!r} does not exist"),
        ([str(ckpt), str(ckpt)], "is the checkpoint being read (CKPT); give another path"),
    ]
    for argv, words in cases:
        assert main(["consolidate", *argv]) == 2, argv
        assert words in error_of(capsys, "consolidate")
    assert ckpt.read_bytes() == b"not read: every case below is refused before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]  # nothing written
    assert main(["consolidate", str(ckpt), "out.ckpt", "--bogus"]) == 2  # argparse's own usage error
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_a_shell_sees_status_2_and_one_paragraph(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    proc = subprocess.run([sys.executable, "-m", "torchfleet", "strategies", "--explain=yes"], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("torchfleet strategies: error: '--explain=yes' is not valid") and \
        proc.stderr.count("\n") == 1, proc.stderr
