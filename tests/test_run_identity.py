"""Which run a version folder and a checkpoint belong to: the version folder is claimed by creating it, and
``ckpt_path="last"`` takes this run's own checkpoint from a folder that several runs write into (one process
stands for several runs here by switching its run id; tests/distributed/test_concurrent_runs.py runs real
concurrent processes)."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from tests.helpers import LogRecords, RegressionData, Regressor, quiet
from torchfleet import Trainer
from torchfleet.callbacks import ModelCheckpoint
from torchfleet.errors import CheckpointError
from torchfleet.loggers import CSVLogger
from torchfleet.loggers.base import allocate_version
from torchfleet.trainer import checkpointing, runs


def test_a_version_folder_taken_after_the_guess_is_not_shared(tmp_path):
    logger = CSVLogger(tmp_path)
    assert logger.version == 0  # listed and guessed: nothing created yet
    assert not (tmp_path / "logs").exists()
    (tmp_path / "logs" / "version_0").mkdir(parents=True)  # another run starting now claims it first
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.save()
    assert logger.version == 1 and os.listdir(tmp_path / "logs" / "version_1") == ["metrics.csv"]
    assert os.listdir(tmp_path / "logs" / "version_0") == []


def test_fsspec_folders_are_claimed_by_creating_them():
    pytest.importorskip("fsspec")
    # the in-memory file system refuses an existing folder as a local one does (object stores cannot: see the docs)
    assert [allocate_version("memory://claims/logs") for _ in range(3)] == [0, 1, 2]


def _fit(run_id, monkeypatch, ck, max_epochs=1, lr=0.05, ckpt_path=None):
    monkeypatch.setattr(runs, "_run_id", run_id)
    trainer = Trainer(**quiet(max_epochs=max_epochs, enable_checkpointing=True,
                              callbacks=[ModelCheckpoint(dirpath=ck, save_last=True)]))
    trainer.fit(Regressor(lr=lr), datamodule=RegressionData(), ckpt_path=ckpt_path)
    return trainer


def test_last_in_a_folder_two_runs_share_is_this_runs_own(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    _fit("run-a", monkeypatch, ck, lr=0.05)
    _fit("run-b", monkeypatch, ck, lr=0.02)  # the same names are taken: its files get -v1
    assert sorted(os.listdir(ck)) == ["epoch=0-step=8-v1.ckpt", "epoch=0-step=8.ckpt", "last-v1.ckpt", "last.ckpt"]
    # run a's later fit resumes run a's last.ckpt, though run b's last-v1.ckpt is newer
    again = _fit("run-a", monkeypatch, ck, max_epochs=2, lr=0.05, ckpt_path="last")
    assert again.ckpt_path == str(ck / "last.ckpt")
    assert again.global_step == 16
    b_again = _fit("run-b", monkeypatch, ck, max_epochs=2, lr=0.02, ckpt_path="last")
    assert b_again.ckpt_path == str(ck / "last-v1.ckpt")


def test_a_new_run_resuming_from_a_shared_folder_says_which_run_it_continues(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    _fit("run-a", monkeypatch, ck)
    _fit("run-b", monkeypatch, ck, lr=0.02)
    with LogRecords() as messages:
        new = _fit("run-c", monkeypatch, ck, max_epochs=2, ckpt_path="last")
    assert new.ckpt_path == str(ck / "last-v1.ckpt")  # the newest, run b's
    said = [m for m in messages if "ckpt_path='last'" in m and "2 runs" in m]
    assert said and "run run-b" in said[0] and "last-v1.ckpt" in said[0], messages
    assert runs.run_id() == "run-b"  # it continues run b: its saves are run b's from now on


def test_a_last_checkpoint_overwritten_by_another_run_before_it_is_read_is_refused(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    _fit("run-b", monkeypatch, ck, lr=0.02)
    shutil.copy(ck / "last.ckpt", tmp_path / "b.ckpt")
    os.remove(ck / "last.ckpt")
    os.remove(ck / "epoch=0-step=8.ckpt")
    _fit("run-a", monkeypatch, ck)
    find = checkpointing.find_last_checkpoint

    def other_run_saves_meanwhile(trainer):
        found = find(trainer)
        shutil.copy(tmp_path / "b.ckpt", found[0])  # run b's save lands on the same name after the choice
        return found

    monkeypatch.setattr(checkpointing, "find_last_checkpoint", other_run_saves_meanwhile)
    model = Regressor()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        Trainer(**quiet(max_epochs=2, enable_checkpointing=True, callbacks=[ModelCheckpoint(dirpath=ck, save_last=True)]
                        )).fit(model, datamodule=RegressionData(), ckpt_path="last")
    message = str(info.value)
    assert "run run-a" in message and "run run-b's state" in message and "Nothing was loaded" in message
    assert all((v == before[k]).all() for k, v in model.state_dict().items())


def test_two_runs_preempted_into_one_folder_keep_their_own_preemption_checkpoint(tmp_path, monkeypatch):
    from tests.test_preemption import SendSignal
    from torchfleet.preemption import Preempted

    ck = tmp_path / "ck"
    for run_id, step in (("run-b", 3), ("run-a", 5)):
        with pytest.raises(Preempted):
            monkeypatch.setattr(runs, "_run_id", run_id)
            Trainer(**quiet(max_epochs=1, enable_checkpointing=True,
                            callbacks=[SendSignal("step", step=step), ModelCheckpoint(dirpath=ck)])
                    ).fit(Regressor(), datamodule=RegressionData())
    assert sorted(os.listdir(ck)) == ["preempted-v1.ckpt", "preempted.ckpt"]
    assert torch.load(ck / "preempted.ckpt", weights_only=True)["global_step"] == 3  # run b's, kept
    assert torch.load(ck / "preempted-v1.ckpt", weights_only=True)["run_id"] == "run-a"
    for run_id, name in (("run-b", "preempted.ckpt"), ("run-a", "preempted-v1.ckpt")):
        resumed = _fit(run_id, monkeypatch, ck, ckpt_path="last")
        assert resumed.ckpt_path == str(ck / name)
