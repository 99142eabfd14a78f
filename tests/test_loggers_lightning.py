"""Lightning's logger API: CSVLogger's experiment writer, root_dir=, and MLflowLogger / WandbLogger in real fits,
read back with each package's own client (MLflow) or record format (wandb's offline run file), offline."""

from __future__ import annotations

import csv
import glob
import json
import os
import struct
import time
import warnings

import pytest
import torch
import yaml

from tests.helpers import RegressionData, Regressor, quiet
from torchfleet import Trainer
from torchfleet.callbacks import ModelCheckpoint
from torchfleet.errors import ConfigurationError
from torchfleet.loggers import CSVLogger, TensorBoardLogger

VAL = [0.9, 0.4]


class _Scripted(Regressor):
    """Logs its global step as "scripted" each training step and a scripted val_loss per epoch."""

    def training_step(self, batch, batch_idx):
        self.log("scripted", float(self.global_step) * 0.5)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", VAL[self.current_epoch])


def _fit(tmp_path, loggers, callbacks=(), **kw):
    trainer = Trainer(max_epochs=2, default_root_dir=tmp_path, log_every_n_steps=2, callbacks=list(callbacks),
                      **quiet(logger=loggers, **kw))
    model = _Scripted(hidden=6, lr=0.02)
    trainer.fit(model, datamodule=RegressionData())
    return trainer, model


def _csv_series(path, name):
    with open(path) as f:
        return {int(r["step"]): float(r[name]) for r in csv.DictReader(f) if r.get(name)}


# ------------------------------------------------------------------------------------------------ CSV
def test_csv_logger_experiment_and_hyperparams_without_arguments(tmp_path):
    logger = CSVLogger(root_dir=tmp_path, name="x", flush_logs_every_n_steps=1)
    writer = logger.experiment
    assert writer is logger.experiment and writer.log_dir == logger.log_dir
    assert logger.metrics_file_path == writer.metrics_file_path == os.path.join(tmp_path, "x", "version_0", "metrics.csv")
    writer.log_hparams({"a": 1})
    logger.log_hyperparams()  # nothing new: the file still holds what was recorded
    logger.log_hyperparams({"b": torch.nn.ReLU()})
    with open(os.path.join(logger.log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f) == {"a": 1, "b": "ReLU()"}
    writer.log_metrics({"loss": torch.tensor(0.25)}, step=3)
    assert writer.metrics == [{"step": 3, "loss": 0.25}]
    writer.save()
    assert _csv_series(logger.metrics_file_path, "loss") == {3: 0.25}


def test_csv_logger_warns_when_an_explicit_version_folder_has_metrics(tmp_path):
    first = CSVLogger(tmp_path, version=3, flush_logs_every_n_steps=1)
    first.log_metrics({"a": 1.0}, step=0)
    with pytest.warns(UserWarning, match=r"already holds a metrics.csv"):
        second = CSVLogger(tmp_path, version=3)
        second.log_metrics({"a": 2.0}, step=0)
    second.save()
    assert _csv_series(second.metrics_file_path, "a") == {0: 2.0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CSVLogger(tmp_path).log_metrics({"a": 1.0}, step=0)  # the next unused version: no warning


def test_root_dir_is_save_dir(tmp_path):
    tb = TensorBoardLogger(root_dir=tmp_path, name="tb")
    assert tb.save_dir == os.fspath(tmp_path) and tb.log_dir == os.path.join(tmp_path, "tb", "version_0")
    with pytest.raises(ConfigurationError, match=r"not both"):
        CSVLogger(tmp_path, root_dir=tmp_path)
    with pytest.raises(ConfigurationError, match=r"save_dir=\.\.\. \(or root_dir"):
        CSVLogger()


# --------------------------------------------------------------------------------------------- MLflow
def test_mlflow_logger_params_metrics_and_checkpoints(tmp_path):
    pytest.importorskip("mlflow", reason="MLflowLogger needs the optional mlflow package (torchfleet[mlflow])")
    from mlflow.tracking import MlflowClient

    from torchfleet.loggers import MLflowLogger

    mlf = MLflowLogger(experiment_name="exp", run_name="r1", save_dir=tmp_path / "mlruns", log_model=True)
    csv_logger = CSVLogger(tmp_path, name="csv")
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=1)
    _fit(tmp_path, [mlf, csv_logger], [ck], enable_checkpointing=True)

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    run = client.get_run(mlf.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "r1"
    assert client.get_experiment(run.info.experiment_id).name == "exp" and mlf.name == run.info.experiment_id
    assert run.data.params["hidden"] == "6" and run.data.params["lr"] == "0.02"
    # every value the Trainer sent, at its step: the CSV file of the same run holds the same
    for name in ("scripted", "train_loss"):
        history = {m.step: m.value for m in client.get_metric_history(mlf.run_id, name)}
        assert history == pytest.approx(_csv_series(csv_logger.metrics_file_path, name))
        assert len(history) == 8
    assert [m.value for m in client.get_metric_history(mlf.run_id, "val_loss")] == pytest.approx(VAL)
    # log_model=True: the best checkpoint, uploaded once training ended
    best = os.path.basename(ck.best_model_path)
    assert best == "epoch=1-step=16.ckpt"
    folder = f"checkpoints/{best[:-5]}"
    assert sorted(os.path.basename(f.path) for f in client.list_artifacts(mlf.run_id, folder)) == ["aliases.txt", best]
    local = client.download_artifacts(mlf.run_id, f"{folder}/{best}", str(tmp_path / "dl"))
    assert torch.load(local, weights_only=True)["global_step"] == 16
    with open(client.download_artifacts(mlf.run_id, f"{folder}/aliases.txt", str(tmp_path / "dl"))) as f:
        latest, best_alias, score = f.read().split()
    assert (latest, best_alias) == ("latest", "best") and float(score.split("=")[1]) == pytest.approx(0.4)


def test_mlflow_logger_all_checkpoints_in_a_sqlite_store(tmp_path):
    pytest.importorskip("mlflow", reason="MLflowLogger needs the optional mlflow package (torchfleet[mlflow])")
    from mlflow.tracking import MlflowClient

    from torchfleet.loggers import MLflowLogger

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    mlf = MLflowLogger(tracking_uri=uri, artifact_location=f"file:{tmp_path / 'art'}", log_model="all")
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=-1)
    _fit(tmp_path, [mlf], [ck], enable_checkpointing=True)
    client = MlflowClient(tracking_uri=uri)
    folders = sorted(os.path.basename(f.path) for f in client.list_artifacts(mlf.run_id, "checkpoints"))
    assert folders == ["epoch=0-step=8", "epoch=1-step=16"]
    with pytest.raises(ConfigurationError, match=r"log_model='some'"):
        MLflowLogger(save_dir=tmp_path, log_model="some")


# ---------------------------------------------------------------------------------------------- wandb
def _wandb_records(path):
    """The records of a wandb offline run file (a LevelDB-style log of the package's protobuf Records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    if not data:  # not written yet
        return
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # a whole record, or its last piece
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def test_wandb_logger_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="WandbLogger needs the optional wandb package (torchfleet[wandb])")
    from torchfleet.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    wb = WandbLogger(project="proj", name="run-a", save_dir=tmp_path / "wb", offline=True, log_model=True)
    csv_logger = CSVLogger(tmp_path, name="csv")
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=1)
    _fit(tmp_path, [wb, csv_logger], [ck], enable_checkpointing=True)
    run_id = wb.version
    assert wb.name == "proj" and wb.save_dir == os.fspath(tmp_path / "wb") and len(run_id) > 0
    wandb.finish()

    (path,) = glob.glob(os.path.join(tmp_path, "wb", "wandb", f"offline-run-*-{run_id}", f"run-{run_id}.wandb"))
    # wandb.finish() can return before wandb's service process has written the run file (measured: empty
    # at first, now and then, on a busy machine): wait for the run's closing record
    deadline = time.monotonic() + 60
    while "exit" not in [r.WhichOneof("record_type") for r in _wandb_records(path)] and time.monotonic() < deadline:
        time.sleep(0.2)
    config, rows, artifacts = {}, [], []
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            assert record.run.project == "proj" and record.run.display_name == "run-a"
        if kind == "config" or kind == "run":
            items = record.config.update if kind == "config" else record.run.config.update
            config.update({item.key: json.loads(item.value_json) for item in items})
        elif kind == "history":
            rows.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item})
        elif kind == "artifact":
            artifacts.append(record.artifact)
    assert config["hidden"] == 6 and config["lr"] == 0.02
    for name in ("scripted", "train_loss"):
        logged = {r["trainer/global_step"]: r[name] for r in rows if name in r}
        assert logged == pytest.approx(_csv_series(csv_logger.metrics_file_path, name))
    assert [r["val_loss"] for r in rows if "val_loss" in r] == pytest.approx(VAL)
    (artifact,) = artifacts
    assert artifact.type == "model" and artifact.name == f"model-{run_id}"
    assert sorted(artifact.aliases) == ["best", "latest"]
    assert [e.path for e in artifact.manifest.contents] == ["epoch=1-step=16.ckpt"]


def test_trainer_logger_and_loggers_can_be_set(tmp_path):
    first, second = CSVLogger(tmp_path, name="a"), CSVLogger(tmp_path, name="b")
    trainer = Trainer(**quiet(logger=True, default_root_dir=tmp_path))
    assert trainer.loggers == [trainer.logger] and trainer.logger is not None
    trainer.logger = first
    assert trainer.logger is first and trainer.loggers == [first]
    trainer.logger = None
    assert trainer.logger is None and trainer.loggers == []
    trainer.loggers = (first, second)  # any sequence, kept as a list
    assert trainer.loggers == [first, second] and trainer.logger is first
    trainer.loggers = None  # as Lightning: no logger
    assert trainer.loggers == [] and trainer.logger is None and trainer.log_dir == str(tmp_path)
    trainer.logger = second
    trainer.fit(Regressor(), datamodule=RegressionData())  # the logger set after construction is the one written
    assert os.path.isfile(os.path.join(second.log_dir, "metrics.csv")) and not os.path.exists(first.log_dir)
