"""CSVLogger and TensorBoardLogger write what was logged; hyperparameters land beside them."""

from __future__ import annotations

import csv
import glob
import os

import pytest
import torch
import yaml

from tests.helpers import RegressionData, Regressor
from torchfleet import Trainer
from torchfleet.errors import ConfigurationError
from torchfleet.loggers import CSVLogger, TensorBoardLogger


def _fit(tmp_path, logger, **kw):
    trainer = Trainer(accelerator="cpu", max_epochs=2, default_root_dir=tmp_path, logger=logger,
                      enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                      log_every_n_steps=4, **kw)
    trainer.fit(Regressor(hidden=5), datamodule=RegressionData())
    return trainer


def test_csv_logger_is_the_default_without_tensorboard(tmp_path, monkeypatch):
    import torchfleet.utilities.imports as imports

    found = imports.package_available
    monkeypatch.setattr(imports, "package_available", lambda name: name != "tensorboard" and found(name))
    trainer = _fit(tmp_path, None)
    assert type(trainer.logger) is CSVLogger
    log_dir = os.path.join(tmp_path, "logs", "version_0")
    assert trainer.log_dir == log_dir
    with open(os.path.join(log_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    assert {"step", "epoch", "train_loss", "val_loss"} <= set(rows[0])
    train_steps = [int(r["step"]) for r in rows if r["train_loss"]]
    assert train_steps == [3, 7, 11, 15]  # every 4th step, numbered from 0 as Lightning's loggers get them
    val_rows = [r for r in rows if r["val_loss"]]
    assert [int(r["epoch"]) for r in val_rows] == [0, 1]
    with open(os.path.join(log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f)["hidden"] == 5
    _fit(tmp_path, None)
    assert os.path.isdir(os.path.join(tmp_path, "logs", "version_1"))


class ImageLogging(Regressor):
    def on_train_epoch_end(self):
        # what Lightning programs do with the default logger (the autoencoder example's image sampler)
        self.logger.experiment.add_image("samples", torch.rand(3, 8, 8), global_step=self.global_step)


def test_tensorboard_logger_is_the_default_when_installed_as_in_lightning(tmp_path):
    pytest.importorskip("tensorboard", reason="the default is a TensorBoardLogger only where tensorboard is installed")
    trainer = Trainer(accelerator="cpu", max_epochs=1, default_root_dir=tmp_path, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, limit_train_batches=2,
                      log_every_n_steps=1)
    trainer.fit(ImageLogging(hidden=5), datamodule=RegressionData())
    assert type(trainer.logger) is TensorBoardLogger
    assert trainer.log_dir == os.path.join(tmp_path, "logs", "version_0")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(trainer.log_dir)
    acc.Reload()
    assert acc.Tags()["images"] == ["samples"] and "train_loss" in acc.Tags()["scalars"]


def test_csv_header_grows_with_new_columns(tmp_path):
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.log_metrics({"a": 2.0, "b": 3.0}, step=1)
    logger.save()
    with open(logger.metrics_file) as f:
        rows = list(csv.DictReader(f))
    assert rows == [{"step": "0", "a": "1.0", "b": ""}, {"step": "1", "a": "2.0", "b": "3.0"}]


def test_tensorboard_logger_writes_events(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="tb")
    _fit(tmp_path, logger)
    events = glob.glob(os.path.join(tmp_path, "tb", "version_0", "events.out.tfevents.*"))
    assert events and os.path.getsize(events[0]) > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.dirname(events[0]))
    acc.Reload()
    assert "train_loss" in acc.Tags()["scalars"] and "val_loss" in acc.Tags()["scalars"]


def test_tensorboard_missing_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(ConfigurationError, match=r"pip install torchfleet\[tensorboard\]"):
        TensorBoardLogger(tmp_path)


def test_several_loggers(tmp_path):
    csv_logger = CSVLogger(tmp_path, name="a")
    tb = TensorBoardLogger(tmp_path, name="b")
    trainer = _fit(tmp_path, [csv_logger, tb])
    assert trainer.logger is csv_logger and trainer.loggers == [csv_logger, tb]
    assert os.path.exists(csv_logger.metrics_file)


# ---------------------------------------------------------------------------------------- ranks other than 0
@pytest.fixture
def on_rank_one(monkeypatch):
    """This process taken for global rank 1 (what a ddp rank 1 reads from its process group)."""
    from torchfleet.utilities import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "_rank", 1)


def _use_from_every_rank(logger) -> None:
    """What user code calls on every rank of a Lightning-style program."""
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.experiment.add_scalar("loss", 1.0, 0)
    logger.experiment.config.update({"lr": 0.1})  # wandb's idiom: a chain on the experiment
    logger.save()
    logger.finalize("success")


@pytest.mark.parametrize("cls", [CSVLogger, TensorBoardLogger])
def test_folder_loggers_write_nothing_on_other_ranks(tmp_path, on_rank_one, cls):
    logger = cls(tmp_path / "logs")
    _use_from_every_rank(logger)
    assert logger.use_version_of(tmp_path / "logs" / "logs" / "version_3" / "checkpoints" / "x.ckpt")
    _use_from_every_rank(logger)
    assert logger.log_dir == os.fspath(tmp_path / "logs" / "logs" / "version_3")  # a name, never a folder made
    assert list(tmp_path.iterdir()) == []


def test_mlflow_and_wandb_loggers_write_nothing_on_other_ranks(tmp_path, on_rank_one, monkeypatch):
    pytest.importorskip("mlflow", reason="MLflowLogger needs the optional mlflow package (torchfleet[mlflow])")
    pytest.importorskip("wandb", reason="WandbLogger needs the optional wandb package (torchfleet[wandb])")
    from torchfleet.loggers import MLflowLogger, WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    for logger in (MLflowLogger(save_dir=tmp_path / "mlflow"), WandbLogger(save_dir=tmp_path / "wandb", offline=True)):
        _use_from_every_rank(logger)
        assert logger.version == ""  # no run: rank 0 creates it, agree_version names it here
    assert list(tmp_path.iterdir()) == []


def test_wandb_logger_travels_to_spawned_ranks(tmp_path):
    pytest.importorskip("wandb", reason="WandbLogger needs the optional wandb package (torchfleet[wandb])")
    import pickle

    from torchfleet.loggers import WandbLogger

    logger = WandbLogger(save_dir=tmp_path, offline=True, id="abc123", project="p")
    copy = pickle.loads(pickle.dumps(logger))  # ddp_spawn pickles the loggers into every rank
    assert (copy.version, copy.name, copy.save_dir) == ("abc123", "p", os.fspath(tmp_path))
    assert copy._wandb is logger._wandb  # the module imported again, not carried
