"""Loggers as a ported Lightning program uses them: TensorBoard's graph and HPARAMS tab, names, folders, CSV files."""

from __future__ import annotations

import csv
import os
import warnings

import pytest
import torch

from tests.helpers import RegressionData, Regressor, quiet
from torchfleet import Trainer
from torchfleet.loggers import CSVLogger, TensorBoardLogger, load_hparams_from_yaml, save_hparams_to_yaml


def _events(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir)
    acc.Reload()
    return acc


def test_log_hyperparams_with_metrics_fills_the_hparams_tab(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="tb", default_hp_metric=False)
    logger.log_hyperparams({"lr": 0.1, "opt": {"name": "sgd"}, "shape": torch.zeros(2, 2)}, {"acc": torch.tensor([0.5])})
    logger.finalize("success")
    acc = _events(logger.log_dir)
    assert acc.Scalars("acc")[0].value == pytest.approx(0.5)
    assert "_hparams_/session_start_info" in acc.PluginTagToContent("hparams")
    assert load_hparams_from_yaml(os.path.join(logger.log_dir, "hparams.yaml"), use_omegaconf=False)["lr"] == 0.1


@pytest.mark.parametrize("default_hp_metric", [True, False])
def test_default_hp_metric(tmp_path, default_hp_metric):
    logger = TensorBoardLogger(tmp_path, default_hp_metric=default_hp_metric)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 1.0}, step=0)  # so that an event file exists either way
    logger.finalize("success")
    scalars = _events(logger.log_dir).Tags()["scalars"]
    assert ("hp_metric" in scalars) is default_hp_metric


class _WithInput(Regressor):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.example_input_array = torch.zeros(3, 8)


def test_fit_logs_the_graph_with_log_graph_true(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="tb", log_graph=True)
    Trainer(max_epochs=1, default_root_dir=tmp_path, **quiet(logger=logger)).fit(
        _WithInput(hidden=6, lr=0.02), datamodule=RegressionData())
    assert _events(logger.log_dir).Tags()["graph"]


def test_graph_needs_an_example_input(tmp_path):
    logger = TensorBoardLogger(tmp_path, log_graph=True)
    model = Regressor(hidden=6, lr=0.02)
    with pytest.warns(UserWarning, match="Could not log computational graph to TensorBoard: The `model.example_input"):
        logger.log_graph(model)
    with pytest.warns(UserWarning, match="of type dict can't be traced by TensorBoard"):
        logger.log_graph(model, {"x": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TensorBoardLogger(tmp_path).log_graph(model)  # log_graph=False: nothing at all


@pytest.mark.parametrize("cls", [CSVLogger, TensorBoardLogger])
@pytest.mark.parametrize("name", ["", None])
def test_no_name_leaves_out_that_folder(tmp_path, cls, name):
    logger = cls(tmp_path, name=name)
    logger.log_hyperparams({"a": 1})
    assert os.path.normpath(logger.root_dir) == os.fspath(tmp_path)
    assert logger.log_dir == os.path.join(tmp_path, "version_0")
    assert os.listdir(tmp_path / "version_0")


def test_log_dir_follows_overridden_name_and_version_and_expands_paths(tmp_path, monkeypatch):
    class Fixed(TensorBoardLogger):
        @property
        def name(self):
            return "run"

        @property
        def version(self):
            return "v"

    assert Fixed(tmp_path).log_dir == os.path.join(tmp_path, "run", "v")
    assert Fixed(tmp_path, sub_dir="train").log_dir == os.path.join(tmp_path, "run", "v", "train")
    monkeypatch.setenv("LOGS_HOME", os.fspath(tmp_path / "env"))
    assert Fixed("$LOGS_HOME/tb").log_dir == os.path.join(tmp_path, "env", "tb", "run", "v")
    assert Fixed("~/tb").log_dir == os.path.join(os.path.expanduser("~"), "tb", "run", "v")


def test_prefix_starts_every_metric_name(tmp_path):
    logger = CSVLogger(tmp_path, prefix="train", flush_logs_every_n_steps=1)
    logger.log_metrics({"loss": 0.5}, step=0)
    with open(logger.metrics_file_path) as f:
        assert next(csv.DictReader(f)) == {"step": "0", "train-loss": "0.5"}


def test_csv_replaces_an_earlier_metrics_file_when_the_writer_starts(tmp_path):
    old = tmp_path / "exp" / "version_0" / "metrics.csv"
    old.parent.mkdir(parents=True)
    old.write_text("step,a\n0,1\n")
    logger = CSVLogger(tmp_path, name="exp", version=0)
    with pytest.warns(UserWarning, match="Experiment logs directory .* exists and is not empty"):
        _ = logger.experiment
    assert not old.exists()


def test_csv_writes_to_an_fsspec_url():
    import fsspec

    logger = CSVLogger("memory://tf-csv-test", flush_logs_every_n_steps=1)
    logger.log_metrics({"loss": 0.25}, step=3)
    logger.log_hyperparams({"lr": 0.5})
    fs = fsspec.filesystem("memory")
    with fs.open(logger.metrics_file_path, "r") as f:
        assert list(csv.DictReader(f)) == [{"step": "3", "loss": "0.25"}]
    assert fs.isfile(os.path.join(logger.log_dir, "hparams.yaml"))
    assert CSVLogger("memory://tf-csv-test").version == 1  # the next unused version, found on that file system


def test_hparams_yaml_round_trip(tmp_path):
    path = tmp_path / "h.yaml"
    save_hparams_to_yaml(path, {"lr": 0.1, "layer": torch.nn.ReLU()})
    assert load_hparams_from_yaml(path, use_omegaconf=False) == {"lr": 0.1, "layer": "ReLU()"}
    with pytest.warns(UserWarning, match="Missing Tags"):
        assert load_hparams_from_yaml(tmp_path / "none.yaml") == {}
