"""Two runs started at the same moment with one default_root_dir: each gets a version folder of its own, its files
stay in it, and ``fit(ckpt_path="last")`` in each resumes that run's own weights (tests/distributed/scripts/
concurrent_run.py is one run; the two wait for each other at a TCPStore before the Trainer starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import yaml

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "concurrent_run.py")

pytestmark = pytest.mark.distributed


def _two_runs_together(tmp_path, strategy: str, devices: int) -> list[dict]:
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60))
    root = tmp_path / "shared"
    env = {k: v for k, v in os.environ.items() if k != "TF_RUN_ID"}  # two runs, as two shells would start them
    procs, outs = [], []
    for i, lr in enumerate((0.05, 0.02)):
        out = str(tmp_path / f"run{i}.json")
        cfg = {"root": str(root), "port": store.port, "strategy": strategy, "devices": devices, "lr": lr,
               "seed": 10 + i, "out": out}
        procs.append(subprocess.Popen([sys.executable, SCRIPT, json.dumps(cfg)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
        outs.append(out)
    logs = [p.communicate(timeout=240)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    results = []
    for out, lr in zip(outs, (0.05, 0.02)):
        with open(out) as f:
            result = json.load(f)
        result["lr"] = lr
        result["weights_at_resume"] = torch.load(out + ".pt", weights_only=True)
        results.append(result)
    return results


@pytest.mark.parametrize(("strategy", "devices"), [("auto", 1), ("ddp", 2)])
def test_two_runs_started_together_keep_their_folders_and_their_last_checkpoint(tmp_path, strategy, devices):
    runs = _two_runs_together(tmp_path, strategy, devices)
    folders = [r["log_dir"] for r in runs]
    assert folders[0] != folders[1], folders
    assert sorted(os.path.basename(f) for f in folders) == ["version_0", "version_1"]
    for run in runs:
        # its own hyperparameters, one metrics file (the default logger's: TensorBoard events, else metrics.csv)
        # and only its own checkpoint
        with open(os.path.join(run["log_dir"], "hparams.yaml")) as f:
            assert yaml.safe_load(f)["lr"] == run["lr"]
        names = os.listdir(run["log_dir"])
        assert len([n for n in names if n.startswith("events.out.tfevents.") or n == "metrics.csv"]) == 1, names
        checkpoints = os.listdir(os.path.join(run["log_dir"], "checkpoints"))
        assert checkpoints == [os.path.basename(run["saved"])], checkpoints
        assert os.path.dirname(run["saved"]) == os.path.join(run["log_dir"], "checkpoints")
        # "last" of a later fit in the same process is the checkpoint this run saved, not the other run's
        assert run["resumed_from"] == run["saved"]
        assert run["second_log_dir"] not in folders
    saved = [torch.load(r["saved"], weights_only=True) for r in runs]
    assert saved[0]["hyper_parameters"]["lr"] == 0.05 and saved[1]["hyper_parameters"]["lr"] == 0.02
    assert saved[0]["run_id"] != saved[1]["run_id"]
    for run, own, other in ((runs[0], saved[0], saved[1]), (runs[1], saved[1], saved[0])):
        for name, value in run["weights_at_resume"].items():
            assert torch.equal(value, own["state_dict"][name]), name
        assert any(not torch.equal(v, other["state_dict"][k]) for k, v in run["weights_at_resume"].items())
