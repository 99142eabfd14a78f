"""``torchfleet run`` argument checks and ``Fleet()`` reading the values it passes (no process is started here).

The launches themselves (2 processes) are in tests/distributed/test_fleet_launch.py.
"""

from __future__ import annotations

import pytest

from torchfleet import Fleet
from torchfleet.cli import main
from torchfleet.errors import ConfigurationError


def test_fleet_takes_the_run_command_values_for_arguments_it_is_not_given(monkeypatch):
    monkeypatch.setenv("TF_FLEET_STRATEGY", "single_device")
    monkeypatch.setenv("TF_FLEET_ACCELERATOR", "cpu")
    monkeypatch.setenv("TF_FLEET_PRECISION", "bf16-mixed")
    fleet = Fleet()
    assert type(fleet.strategy).__name__ == "SingleDeviceStrategy"
    assert fleet.device.type == "cpu" and fleet.strategy.precision.name == "bf16-mixed"
    # the same value in both places is fine; a different one is refused
    assert Fleet(accelerator="cpu").device.type == "cpu"
    with pytest.raises(ConfigurationError, match=r"Fleet\(precision='64-true'\) disagrees with --precision bf16"):
        Fleet(precision="64-true")


def test_run_refuses_bad_arguments_before_starting_anything(tmp_path, capsys, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    cases = [
        (["missing.py"], "the script 'missing.py' does not exist"),
        ([str(script), "--strategy", "ddp_spawn", "--accelerator", "cpu", "--devices", "2"],
         "starts its processes itself"),
        ([str(script), "--strategy", "ddq", "--accelerator", "cpu"], "ddq"),
        ([str(script), "--accelerator", "cpu", "--devices", "1", "--num-nodes", "2", "--strategy", "ddp"],
         "needs --main-port"),
        ([str(script), "--accelerator", "cpu", "--num-nodes", "2", "--node-rank", "2", "--main-port", "29999",
          "--strategy", "ddp"], "--node-rank 2 is not valid with --num-nodes 2"),
        ([str(tmp_path)], f"the script {str(tmp_path)!r} is a directory, not a Python file"),
        ([str(script), "--num-nodes", "0"], "--num-nodes 0 is not valid: give the number of machines in the run"),
        ([str(script), "--num-nodes", "-2"], "--num-nodes -2 is not valid"),
        ([str(script), "--main-port", "99999"], "--main-port 99999 is not valid: give a TCP port, 1..65535"),
        ([str(script), "--main-port", "0"], "--main-port 0 is not valid"),
        ([str(script), "--accelerator", "cpu", "--devices", "0"], "devices=0 is not valid for the CPU"),
        ([str(script), "--accelerator", "cpu", "--devices", "1000000"],
         "1000000 processes on a machine with"),
        ([str(script), "--max-restarts", "-1"], "max_restarts=-1 is not valid"),
    ]
    for argv, message in cases:
        assert main(["run", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("torchfleet run: error:") and message in err, (argv, err)
        assert err.count("\n") == 1 and "torchfleet run: error: torchfleet run:" not in err, err
    monkeypatch.setenv("MASTER_PORT", "abc")
    assert main(["run", str(script)]) == 2
    assert "The environment variable MASTER_PORT='abc' is not a TCP port" in capsys.readouterr().err
    assert main(["run", str(script), "--num-nodes", "two"]) == 2  # argparse's own usage error
    assert "argument --num-nodes: invalid int value: 'two'" in capsys.readouterr().err
