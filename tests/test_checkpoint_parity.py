"""ModelCheckpoint as a ported Lightning program sees it: when it saves, save_last="link", versions, what it deletes."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch

from tests.helpers import RegressionData, Regressor
from tests.test_callbacks import ScriptedVal  # a scripted val_loss per epoch (8 training batches an epoch)
from torchfleet import Trainer
from torchfleet.callbacks import ModelCheckpoint
from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks import checkpoint as checkpoint_module


def _fit(model, callbacks, root, ckpt_path=None, **kw):
    args = dict(accelerator="cpu", max_epochs=2, default_root_dir=root, callbacks=callbacks, enable_progress_bar=False,
                enable_model_summary=False, logger=False, num_sanity_val_steps=0)
    args.update(kw)
    trainer = Trainer(**args)
    trainer.fit(model, datamodule=RegressionData(shuffle=False), ckpt_path=ckpt_path)
    return trainer


class CountSaves(ModelCheckpoint):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.written = []

    def _write(self, trainer, path):
        self.written.append(os.path.basename(path))
        super()._write(trainer, path)


def test_save_last_link_points_last_at_the_newest_checkpoint_without_writing_it(tmp_path):
    ck = CountSaves(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=1, save_last="link")
    _fit(ScriptedVal([0.5, 0.4]), [ck], tmp_path)
    last = tmp_path / "ck" / "last.ckpt"
    assert ck.written == ["epoch=0-step=8.ckpt", "epoch=1-step=16.ckpt"]  # last.ckpt is never written
    assert os.path.islink(last) and os.readlink(last) == "epoch=1-step=16.ckpt"  # relative: the folder may move
    assert torch.load(last, weights_only=True)["global_step"] == 16
    assert sorted(os.listdir(tmp_path / "ck")) == ["epoch=1-step=16.ckpt", "last.ckpt"]


def test_last_is_written_only_where_a_checkpoint_was(tmp_path):
    ck = CountSaves(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=1, save_last=True)
    _fit(ScriptedVal([0.4, 0.9]), [ck], tmp_path)  # epoch 1 is worse: nothing saved, last.ckpt stays at epoch 0
    assert ck.written == ["epoch=0-step=8.ckpt", "last.ckpt"]
    assert torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)["global_step"] == 8


def test_a_stop_by_max_steps_inside_the_epoch_still_saves(tmp_path):
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)
    trainer = _fit(Regressor(), [ck], tmp_path, max_steps=3)
    assert trainer.global_step == 3
    assert sorted(os.listdir(tmp_path / "ck")) == ["epoch=0-step=3.ckpt", "last.ckpt"]


@pytest.mark.parametrize(("val_check_interval", "expected"), [
    # validation at each epoch's end: the epoch-end save rules, so steps 4 and 8 (no val_loss yet) are never saved,
    # step 16 is saved at its batch end with epoch 0's value
    (1.0, ["step=12-val_loss=0.5.ckpt", "step=16-val_loss=0.5.ckpt"]),
    # validation twice an epoch: each step save waits for the validation that logs val_loss (or renews it)
    (0.5, ["step=12-val_loss=0.5.ckpt", "step=16-val_loss=0.4.ckpt", "step=4-val_loss=0.5.ckpt",
           "step=8-val_loss=0.5.ckpt"]),
])
def test_step_saves_with_a_value_only_validation_logs(tmp_path, val_check_interval, expected):
    # the file names Lightning 2.6.6 writes for the same program
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", every_n_train_steps=4, save_top_k=-1,
                         filename="{step}-{val_loss:.1f}")
    _fit(ScriptedVal([0.5, 0.4]), [ck], tmp_path, val_check_interval=val_check_interval)
    assert sorted(os.listdir(tmp_path / "ck")) == expected


def test_train_time_interval_takes_a_timedelta_counted_from_the_start_of_training(tmp_path, monkeypatch):
    clock = iter(range(0, 10_000, 7))  # every read of the clock is 7 s later

    class Clock:
        @staticmethod
        def monotonic():
            return float(next(clock))

    ck = ModelCheckpoint(dirpath=tmp_path / "ck", train_time_interval=timedelta(seconds=20), save_top_k=-1,
                         filename="{step}")
    monkeypatch.setattr(checkpoint_module, "time", Clock)
    _fit(Regressor(), [ck], tmp_path, max_epochs=1)
    # the clock is read at the start of training (0 s) and after each batch (7, 14, 21, ...): 21 s, then 21 s later
    assert sorted(os.listdir(tmp_path / "ck"), key=lambda n: int(n[5:-5])) == ["step=3.ckpt", "step=6.ckpt"]


def test_each_file_records_itself_and_resuming_keeps_the_file_resumed_from(tmp_path):
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="step", mode="max", save_top_k=2, every_n_train_steps=2,
                         filename="{step}")
    _fit(Regressor(), [ck], tmp_path, max_steps=5)
    state = next(v for k, v in torch.load(tmp_path / "ck" / "step=4.ckpt", weights_only=True)["callbacks"].items()
                 if k.startswith("ModelCheckpoint"))
    assert state["best_model_path"] == str(tmp_path / "ck" / "step=4.ckpt") and float(state["current_score"]) == 4
    ck2 = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="step", mode="max", save_top_k=2, every_n_train_steps=2,
                          filename="{step}")
    _fit(Regressor(), [ck2], tmp_path, max_steps=8, ckpt_path=tmp_path / "ck" / "step=4.ckpt")
    assert sorted(os.listdir(tmp_path / "ck")) == ["step=4.ckpt", "step=6.ckpt", "step=8.ckpt"]


def test_folder_is_absolute_and_missing_metrics_read_zero(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ModelCheckpoint(dirpath="./~/ck").dirpath == os.path.join(os.path.realpath(tmp_path), "~", "ck")
    assert ModelCheckpoint(filename="{val_loss:.2f}").format_checkpoint_name({}) == "val_loss=0.00.ckpt"


def test_state_from_another_folder_keeps_only_the_best_path(tmp_path):
    old = ModelCheckpoint(dirpath=tmp_path / "old", monitor="val_loss")
    old.best_model_path, old.best_k_models = "x.ckpt", {"x.ckpt": 0.1}
    new = ModelCheckpoint(dirpath=tmp_path / "new", monitor="val_loss")
    with pytest.warns(UserWarning, match="The dirpath has changed from"):
        new.load_state_dict(old.state_dict())
    assert new.best_model_path == "x.ckpt" and new.best_k_models == {}


def test_link_needs_a_local_folder(tmp_path):
    with pytest.raises(ConfigurationError, match=r"`ModelCheckpoint\(save_last='link'\)` is only supported for local"):
        ModelCheckpoint(dirpath="s3://bucket/ck", save_last="link").setup(trainer=None, pl_module=None, stage="fit")


def test_a_missing_monitored_value_warns_before_any_validation_and_fails_after(tmp_path):
    ck = ModelCheckpoint(dirpath=tmp_path / "a", monitor="val_acc")
    with pytest.warns(UserWarning, match="could not find the monitored key in the returned metrics"):
        _fit(Regressor(), [ck], tmp_path, max_epochs=1, limit_val_batches=0)  # saves at epoch end, no validation
    assert not (tmp_path / "a").exists()
    with pytest.raises(ConfigurationError, match=r"ModelCheckpoint\(monitor='val_acc'\) found no metric 'val_acc'"):
        _fit(Regressor(), [ModelCheckpoint(dirpath=tmp_path / "b", monitor="val_acc")], tmp_path, max_epochs=1)
