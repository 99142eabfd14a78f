"""torchfleet.cli.CLI(MyModel, MyData) in a user's script, run as a user runs it: python train.py fit ..."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from torchfleet.cli import CLI, _metric_rows
from torchfleet.errors import ConfigurationError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent('''
    """A user's training script."""
    import json
    import os
    import sys

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from torchfleet import DataModule, Module
    from torchfleet.cli import CLI


    class Net(Module):
        """Regression with one hidden layer.

        Args:
            hidden: width of the hidden layer.
            lr: SGD learning rate.
        """

        def __init__(self, hidden: int = 8, lr: float = 0.1):
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

        def test_step(self, batch, batch_idx):
            x, y = batch
            self.log("test_loss", nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


    class Data(DataModule):
        """Random regression data.

        Args:
            batch_size: examples per batch.
            n: examples in the set.
        """

        def __init__(self, batch_size: int = 4, n: int = 64):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            x = torch.randn(n, 3, generator=g)
            self.set = TensorDataset(x, x.sum(1, keepdim=True))
            self.batch_size = batch_size

        def train_dataloader(self):
            return DataLoader(self.set, batch_size=self.batch_size)

        val_dataloader = test_dataloader = train_dataloader


    if __name__ == "__main__":
        cli = CLI(Net, Data, run=os.environ.get("NO_RUN") is None)
        with open(os.environ["REPORT"], "w") as f:
            json.dump({"hidden": cli.model.net[0].out_features, "batch_size": cli.datamodule.batch_size,
                       "max_epochs": cli.trainer.max_epochs, "global_step": cli.trainer.global_step,
                       "subcommand": cli.subcommand}, f)
''')


def start(tmp_path, *args: str, no_run: bool = False, report_name: str = "report.json") -> tuple[subprocess.Popen, Path]:
    """Start ``python train.py ARGS`` in ``tmp_path``; :func:`finish` waits for it. The script reports to
    ``report_name`` (several runs started together each name their own)."""
    script = tmp_path / "train.py"
    if not script.exists():
        script.write_text(SCRIPT)
    report = tmp_path / report_name
    report.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src"), "REPORT": str(report), "OMP_NUM_THREADS": "1"}
    env.pop("NO_RUN", None)
    if no_run:
        env["NO_RUN"] = "1"
    quiet = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
             f"--trainer.default_root_dir={tmp_path}"] if args and not args[-1].startswith("--print") else []
    proc = subprocess.Popen([sys.executable, str(script), *args, *quiet], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    return proc, report


def finish(started: tuple[subprocess.Popen, Path]) -> tuple[subprocess.CompletedProcess, dict | None]:
    import json

    proc, report = started
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done, (json.loads(report.read_text()) if report.exists() else None)


def run(tmp_path, *args: str, no_run: bool = False) -> tuple[subprocess.CompletedProcess, dict | None]:
    return finish(start(tmp_path, *args, no_run=no_run))


def test_fit_with_model_data_and_trainer_options(tmp_path):
    proc, report = run(tmp_path, "fit", "--model.hidden=5", "--trainer.max_epochs=2", "--data.batch_size=16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report == {"hidden": 5, "batch_size": 16, "max_epochs": 2, "global_step": 2 * 64 // 16,
                      "subcommand": "fit"}
    rows, _ = _metric_rows(str(tmp_path / "logs" / "version_0"))  # TensorBoard's events, or metrics.csv
    assert any(r.get("val_loss") for r in rows)
    assert "Finished: epoch 2, step 8" in proc.stdout


def test_print_config_then_config_file_then_test_from_last(tmp_path):
    proc, _ = run(tmp_path, "fit", "--model.hidden=6", "--trainer.max_epochs=1", "--print_config")
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = yaml.safe_load(proc.stdout)
    assert printed["model"] == {"hidden": 6, "lr": 0.1} and printed["data"] == {"batch_size": 4, "n": 64}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(printed))
    proc, report = run(tmp_path, "fit", "--config", str(tmp_path / "run.yaml"), "--data.batch_size=8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["hidden"] == 6 and report["batch_size"] == 8 and report["global_step"] == 64 // 8
    proc, report = run(tmp_path, "test", "--model.hidden=6", "--ckpt_path=last")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["subcommand"] == "test"
    assert "Loading weights from" in proc.stdout and "test_loss" in proc.stderr


def test_help_describes_the_user_classes(tmp_path):
    proc, _ = run(tmp_path, "fit", "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--model.hidden" in proc.stdout and "width of the hidden layer" in proc.stdout
    assert "--data.batch_size" in proc.stdout and "examples per batch" in proc.stdout
    assert "--trainer.max_epochs" in proc.stdout and "type: Any" not in proc.stdout


def test_no_run_builds_the_objects(tmp_path):
    proc, report = run(tmp_path, "--model.hidden=3", "--trainer.max_epochs=7", no_run=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report == {"hidden": 3, "batch_size": 4, "max_epochs": 7, "global_step": 0, "subcommand": None}


def test_bad_subcommand_and_bad_option(tmp_path):
    # three independent command lines, started together (each imports torch)
    started = [start(tmp_path, *args, report_name=f"report-{i}.json") for i, args in enumerate(
        [("fitt",), ("fit", "--model.hiden=3"), ("fit", "--trainer.strategy=dpp")])]
    (subcommand, report), (option, _), (strategy, _) = [finish(s) for s in started]
    assert subcommand.returncode == 2 and report is None
    assert "unknown subcommand 'fitt'" in subcommand.stderr and "fit, validate, test, predict" in subcommand.stderr
    assert option.returncode == 2 and "hiden" in option.stderr
    # a library error: one paragraph, status 2
    assert strategy.returncode == 2 and "Unknown strategy 'dpp'. Did you mean" in strategy.stderr
    assert "Traceback" not in strategy.stderr and len(strategy.stderr.strip().splitlines()) == 1


def test_classes_must_be_module_classes():
    with pytest.raises(ConfigurationError, match="give a subclass of torchfleet.Module"):
        CLI(object, args=["fit"])
    with pytest.raises(ConfigurationError, match="not an instance"):
        from tests.helpers import Regressor

        CLI(Regressor(), args=["fit"])
