"""ModelCheckpoint, EarlyStopping, ProgressBar, LearningRateMonitor and ThroughputMonitor in real Trainer runs."""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch import nn

from tests.helpers import RegressionData, Regressor, loader, quiet
from torchfleet import Trainer
from torchfleet.callbacks import (
    Callback,
    EarlyStopping,
    EarlyStoppingReason,
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
    ThroughputMonitor,
)
from torchfleet.errors import ConfigurationError
from torchfleet.loggers import Logger


class ScriptedVal(Regressor):
    """Logs a scripted val_loss per epoch, so which checkpoints are best is known in advance."""

    def __init__(self, values, **kw):
        super().__init__(**kw)
        self.values = values

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", float(self.values[self.current_epoch]))


def _fit(model, callbacks, tmp_path, epochs, **kw):
    trainer = Trainer(accelerator="cpu", max_epochs=epochs, default_root_dir=tmp_path, callbacks=callbacks,
                      enable_progress_bar=False, enable_model_summary=False, logger=False, num_sanity_val_steps=0, **kw)
    trainer.fit(model, datamodule=RegressionData())
    return trainer


def test_top_k_keeps_exactly_the_best(tmp_path):
    values = [0.9, 0.5, 0.7, 0.3, 0.8, 0.4]
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=2, filename="{epoch}-{val_loss:.2f}",
                         save_last=True)
    _fit(ScriptedVal(values), [ck], tmp_path, epochs=6)
    files = sorted(os.listdir(tmp_path / "ck"))
    assert files == ["epoch=3-val_loss=0.30.ckpt", "epoch=5-val_loss=0.40.ckpt", "last.ckpt"]
    assert ck.best_model_path.endswith("epoch=3-val_loss=0.30.ckpt")
    assert ck.best_model_score.item() == pytest.approx(0.3)
    assert ck.kth_best_model_path.endswith("epoch=5-val_loss=0.40.ckpt")
    last = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=False)
    assert last["epoch"] == 5 and last["global_step"] == 48


def test_max_mode_and_nan_is_never_best(tmp_path):
    values = [0.1, float("nan"), 0.6, 0.2]
    ck = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", mode="max", save_top_k=1)
    _fit(ScriptedVal(values), [ck], tmp_path, epochs=4)
    assert os.path.basename(ck.best_model_path) == "epoch=2-step=24.ckpt"
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".ckpt")) == ["epoch=2-step=24.ckpt"]


def test_every_n_train_steps_without_monitor_keeps_latest(tmp_path):
    ck = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5)
    _fit(Regressor(), [ck], tmp_path, epochs=2)
    assert os.listdir(tmp_path) == ["epoch=1-step=15.ckpt"]
    ck_all = ModelCheckpoint(dirpath=tmp_path / "all", every_n_train_steps=5, save_top_k=-1)
    _fit(Regressor(), [ck_all], tmp_path, epochs=2)
    assert sorted(os.listdir(tmp_path / "all")) == ["epoch=0-step=5.ckpt", "epoch=1-step=10.ckpt", "epoch=1-step=15.ckpt"]


def test_default_checkpoint_dir_is_under_the_logger(tmp_path):
    trainer = Trainer(accelerator="cpu", max_epochs=1, default_root_dir=tmp_path,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regressor(), datamodule=RegressionData())
    assert trainer.checkpoint_callback.dirpath == os.path.join(tmp_path, "logs", "version_0", "checkpoints")
    assert os.listdir(trainer.checkpoint_callback.dirpath) == ["epoch=0-step=8.ckpt"]


def test_missing_monitor_lists_logged_metrics(tmp_path):
    ck = ModelCheckpoint(dirpath=tmp_path, monitor="val_acc")
    with pytest.raises(ConfigurationError, match=r"'val_acc'.*train_loss.*val_loss"):
        _fit(Regressor(), [ck], tmp_path, epochs=1)


def test_bad_checkpoint_arguments():
    with pytest.raises(ConfigurationError, match="mode"):
        ModelCheckpoint(mode="lowest")
    with pytest.raises(ConfigurationError, match="monitor"):
        ModelCheckpoint(save_top_k=3)
    with pytest.raises(ConfigurationError, match="one of"):
        ModelCheckpoint(every_n_train_steps=2, every_n_epochs=1)


def test_checkpoint_state_survives_resume(tmp_path):
    values = [0.9, 0.2, 0.7, 0.5]
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=1, save_last=True)
    _fit(ScriptedVal(values), [ck], tmp_path, epochs=2)
    ck2 = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=1, save_last=True)
    trainer = Trainer(accelerator="cpu", max_epochs=4, default_root_dir=tmp_path, callbacks=[ck2],
                      enable_progress_bar=False,
                      enable_model_summary=False, logger=False, num_sanity_val_steps=0)
    trainer.fit(ScriptedVal(values), datamodule=RegressionData(), ckpt_path=tmp_path / "ck" / "last.ckpt")
    # epoch 1's 0.2 stays the best: the resumed callback remembered it and did not replace it with 0.5
    assert os.path.basename(ck2.best_model_path) == "epoch=1-step=16.ckpt"
    assert sorted(os.listdir(tmp_path / "ck")) == ["epoch=1-step=16.ckpt", "last.ckpt"]


def test_two_checkpoint_callbacks_keep_separate_state():
    a = ModelCheckpoint(monitor="val_loss")
    b = ModelCheckpoint(monitor="train_loss")
    assert a.state_key != b.state_key


def test_early_stopping_after_patience(tmp_path):
    es = EarlyStopping(monitor="val_loss", patience=2)
    trainer = _fit(ScriptedVal([1.0, 0.5, 0.6, 0.55, 0.4, 0.3]), [es], tmp_path, epochs=6)
    assert trainer.should_stop and es.stopped_epoch == 3 and trainer.current_epoch == 4
    assert es.best_score.item() == pytest.approx(0.5)
    assert es.stopping_reason is EarlyStoppingReason.PATIENCE_EXHAUSTED
    assert "did not improve" in es.stopping_reason_message


def test_early_stopping_thresholds_and_min_delta(tmp_path):
    es = EarlyStopping(monitor="val_loss", stopping_threshold=0.25, patience=100)
    trainer = _fit(ScriptedVal([1.0, 0.5, 0.2, 0.1]), [es], tmp_path, epochs=4)
    assert es.stopped_epoch == 2 and "threshold" in es.stopping_reason_message
    assert es.stopping_reason is EarlyStoppingReason.STOPPING_THRESHOLD
    es = EarlyStopping(monitor="val_loss", min_delta=0.1, patience=1)
    _fit(ScriptedVal([1.0, 0.95, 0.5, 0.4]), [es], tmp_path, epochs=4)
    assert es.stopped_epoch == 1  # 0.95 is not 0.1 better than 1.0
    es = EarlyStopping(monitor="val_loss", patience=5)
    _fit(ScriptedVal([1.0, float("nan"), 0.5]), [es], tmp_path, epochs=3)
    assert es.stopped_epoch == 1 and "not finite" in es.stopping_reason_message
    assert es.stopping_reason is EarlyStoppingReason.NON_FINITE_METRIC
    del trainer


def test_early_stopping_missing_metric(tmp_path):
    with pytest.raises(ConfigurationError, match="'acc'"):
        _fit(Regressor(), [EarlyStopping(monitor="acc")], tmp_path, epochs=1)
    _fit(Regressor(), [EarlyStopping(monitor="acc", strict=False)], tmp_path, epochs=1)


def test_early_stopping_respects_min_epochs(tmp_path):
    es = EarlyStopping(monitor="val_loss", patience=1)
    trainer = _fit(ScriptedVal([1.0, 2.0, 3.0, 4.0, 5.0]), [es], tmp_path, epochs=5, min_epochs=4)
    assert es.stopped_epoch == 3 and trainer.current_epoch == 4


class Recorder(Logger):
    def __init__(self):
        self.rows = []

    name = "rec"
    version = 0

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))


def test_lr_monitor_logs_scheduled_values(tmp_path):
    rec = Recorder()
    trainer = Trainer(max_epochs=3, logger=rec, callbacks=[LearningRateMonitor()], **{k: v for k, v in quiet().items() if k != "logger"})
    trainer.fit(Regressor(scheduler="epoch"), loader())
    lrs = [m["lr-SGD"] for _, m in rec.rows if "lr-SGD" in m]
    assert lrs == pytest.approx([0.05, 0.025, 0.0125])


def test_throughput_monitor_counts_samples(tmp_path):
    tm = ThroughputMonitor(length_fn=lambda batch: batch[0].numel(), flops_per_batch=1000.0, window_size=4)
    Trainer(max_epochs=1, callbacks=[tm], **quiet()).fit(Regressor(), loader(64, batch_size=8))
    m = tm.metrics
    assert tm.samples == 64 and tm.tokens == 64 * 8
    assert m["throughput/samples_per_sec"] == pytest.approx(8 * m["throughput/batches_per_sec"])
    assert m["throughput/tokens_per_sec"] == pytest.approx(64 * m["throughput/batches_per_sec"])
    assert m["throughput/flops_per_sec"] == pytest.approx(1000 * m["throughput/batches_per_sec"])
    assert m["throughput/global_samples_per_sec"] == m["throughput/samples_per_sec"]


def test_progress_bar_shows_metrics(tmp_path, capsys):
    bar = ProgressBar(refresh_interval=0.0)
    trainer = Trainer(accelerator="cpu", max_epochs=1, callbacks=[bar], enable_progress_bar=True,
                      enable_model_summary=False, logger=False,
                      enable_checkpointing=False, num_sanity_val_steps=0)
    trainer.fit(Regressor(), datamodule=RegressionData())
    err = capsys.readouterr().err
    assert "Epoch 0" in err and "train_loss" in err and "8/8" in err and "Validation" in err


def test_progress_bar_totals_follow_the_epoch(tmp_path):
    bar = ProgressBar(refresh_interval=3600.0)
    with pytest.raises(ConfigurationError, match="before the bar was given to a running Trainer"):
        bar.total_val_batches
    seen = []

    class Watch(Callback):
        def on_train_epoch_start(self, trainer, module):
            seen.append((trainer.current_epoch, bar.total_train_batches, bar.total_val_batches))

    trainer = Trainer(max_epochs=4, check_val_every_n_epoch=2, limit_val_batches=3, limit_train_batches=5,
                      callbacks=[bar, Watch()], **{k: v for k, v in quiet().items() if k != "enable_progress_bar"})
    class TwoValLoaders(Regressor):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            return super().validation_step(batch, batch_idx)

    two_val_loaders = [loader(64, batch_size=8), loader(16, batch_size=8)]  # 3 batches, then 2 (all it has)
    trainer.fit(TwoValLoaders(), loader(64, batch_size=8), two_val_loaders)
    assert seen == [(0, 5, 0), (1, 5, 5), (2, 5, 0), (3, 5, 5)]
    assert bar.trainer is trainer


def test_progress_bar_counts_down_the_steps_left_when_epochs_are_unbounded():
    bar = ProgressBar(refresh_interval=3600.0)
    totals = []

    class Watch(Callback):
        def on_train_epoch_start(self, trainer, module):
            totals.append(bar.total_train_batches)

    Trainer(max_epochs=-1, max_steps=20, callbacks=[bar, Watch()],
            **{k: v for k, v in quiet().items() if k != "enable_progress_bar"}).fit(Regressor(), loader(64, 8))
    assert totals == [8, 8, 4]  # 8 batches an epoch; the third epoch ends the run at step 20


def test_progress_bar_off_removes_it():
    trainer = Trainer(enable_progress_bar=False, **{k: v for k, v in quiet().items() if k != "enable_progress_bar"})
    assert not any(isinstance(c, ProgressBar) for c in trainer.callbacks)


def test_callback_hooks_receive_trainer_and_module():
    seen = []

    class Spy(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append((trainer.global_step, type(module).__name__, float(outputs) > 0, batch_idx))

        def on_save_checkpoint(self, trainer, module, checkpoint):
            checkpoint["spy"] = True

    Trainer(max_epochs=1, limit_train_batches=2, callbacks=[Spy()], **quiet()).fit(Regressor(), loader())
    assert seen == [(1, "Regressor", True, 0), (2, "Regressor", True, 1)]


def test_configure_callbacks_from_model_replaces_same_type(tmp_path):
    class WithOwnCheckpoint(Regressor):
        def configure_callbacks(self):
            return [ModelCheckpoint(dirpath=tmp_path / "own", filename="mine")]

    trainer = Trainer(accelerator="cpu", max_epochs=1, default_root_dir=tmp_path,
                      enable_progress_bar=False, enable_model_summary=False,
                      logger=False)
    trainer.fit(WithOwnCheckpoint(), datamodule=RegressionData())
    assert len(trainer.checkpoint_callbacks) == 1 and os.listdir(tmp_path / "own") == ["mine.ckpt"]


def test_async_checkpoint_io_with_top_k(tmp_path):
    from torchfleet.checkpoint import AsyncCheckpointIO

    values = [0.9, 0.5, 0.7, 0.3]
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=2, save_last=True)
    trainer = Trainer(accelerator="cpu", max_epochs=4, default_root_dir=tmp_path, callbacks=[ck],
                      plugins=[AsyncCheckpointIO()],
                      enable_progress_bar=False, enable_model_summary=False, logger=False, num_sanity_val_steps=0)
    trainer.fit(ScriptedVal(values), datamodule=RegressionData())
    # every background write finished by the end of fit, and deletions waited for them
    assert sorted(os.listdir(tmp_path / "ck")) == ["epoch=1-step=16.ckpt", "epoch=3-step=32.ckpt", "last.ckpt"]
    assert torch.load(tmp_path / "ck" / "last.ckpt", weights_only=False)["global_step"] == 32


# ------------------------------------------------------------------ ModelCheckpoint: Lightning parity
# Each RegressionData epoch is 8 optimizer steps, so epoch e ends at global step 8 * (e + 1).


def test_dirpath_expands_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    ck = ModelCheckpoint(dirpath="~/ckpts")
    assert ck.dirpath == os.path.join(str(tmp_path / "home"), "ckpts")
    _fit(Regressor(), [ck], tmp_path, epochs=1)
    assert os.listdir(tmp_path / "home" / "ckpts") == ["epoch=0-step=8.ckpt"]
    assert os.listdir(tmp_path / "work") == []  # no literal "~" folder


@pytest.mark.parametrize("monitor", ["val_loss", None])
def test_validation_every_second_epoch_saves_only_after_validation(tmp_path, monitor):
    # validation runs after epochs 1 and 3 only; epochs 0 and 2 (and 4) produce no val_loss and save nothing
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", monitor=monitor, save_top_k=-1)
    _fit(ScriptedVal([0.5, 0.4, 0.3, 0.2, 0.1]), [ck], tmp_path, epochs=5, check_val_every_n_epoch=2)
    assert sorted(os.listdir(tmp_path / "ck")) == ["epoch=1-step=16.ckpt", "epoch=3-step=32.ckpt"]


def test_second_run_versions_last_and_top_k(tmp_path):
    # as Lightning: a new callback finding another run's last.ckpt writes last-v1.ckpt beside it
    for epochs in (1, 2):
        ck = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=-1, save_last=True)
        _fit(ScriptedVal([0.5, 0.4]), [ck], tmp_path, epochs=epochs)
    assert sorted(os.listdir(tmp_path / "ck")) == [
        "epoch=0-step=8-v1.ckpt", "epoch=0-step=8.ckpt", "epoch=1-step=16.ckpt", "last-v1.ckpt", "last.ckpt",
    ]
    assert torch.load(tmp_path / "ck" / "last.ckpt", weights_only=False)["global_step"] == 8
    assert torch.load(tmp_path / "ck" / "last-v1.ckpt", weights_only=False)["global_step"] == 16
    assert ck.last_model_path == str(tmp_path / "ck" / "last-v1.ckpt")
    assert ModelCheckpoint.find_last(tmp_path / "ck") == ck.last_model_path  # the newest of the two


@pytest.mark.parametrize(("mode", "worst"), [("min", math.inf), ("max", -math.inf)])
def test_nan_first_score_is_recorded_as_the_worst(tmp_path, mode, worst):
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", mode=mode, save_top_k=1)
    _fit(ScriptedVal([float("nan"), 0.5]), [ck], tmp_path, epochs=1)
    assert ck.best_model_score.item() == worst
    assert ck.current_score.item() == worst
    assert os.path.basename(ck.best_model_path) == "epoch=0-step=8.ckpt"
    # any real score beats it
    ck2 = ModelCheckpoint(dirpath=tmp_path / "ck2", monitor="val_loss", mode=mode, save_top_k=1)
    _fit(ScriptedVal([float("nan"), 0.5]), [ck2], tmp_path, epochs=2)
    assert os.listdir(tmp_path / "ck2") == ["epoch=1-step=16.ckpt"]
    assert ck2.best_model_score.item() == pytest.approx(0.5)


def test_current_score_is_the_latest_saved_value(tmp_path):
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=-1)
    assert ck.current_score is None
    _fit(ScriptedVal([0.5, 0.7]), [ck], tmp_path, epochs=2)
    assert ck.current_score.item() == pytest.approx(0.7)
    assert ck.best_model_score.item() == pytest.approx(0.5)


def test_no_monitor_keeps_the_latest_under_its_name_and_ranks_nothing(tmp_path):
    ck = ModelCheckpoint(dirpath=tmp_path / "one", filename="model")
    _fit(Regressor(), [ck], tmp_path, epochs=2)
    assert os.listdir(tmp_path / "one") == ["model.ckpt"]
    assert ck.best_model_path == os.path.join(tmp_path / "one", "model.ckpt")
    assert ck.best_k_models == {}
    ck_all = ModelCheckpoint(dirpath=tmp_path / "all", save_top_k=-1)
    _fit(Regressor(), [ck_all], tmp_path, epochs=2)
    assert sorted(os.listdir(tmp_path / "all")) == ["epoch=0-step=8.ckpt", "epoch=1-step=16.ckpt"]
    assert ck_all.best_model_path == os.path.join(tmp_path / "all", "epoch=1-step=16.ckpt")
    assert ck_all.best_k_models == {}


def test_fast_dev_run_keeps_model_checkpoint_but_saves_nothing(tmp_path):
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_last=True)
    _fit(ScriptedVal([0.5]), [ck], tmp_path, epochs=1, fast_dev_run=1)
    assert not os.path.exists(tmp_path / "ck")
    assert ck.best_model_path == "" and ck.last_model_path == ""
    with pytest.raises(ConfigurationError, match="enable_checkpointing=False"):
        Trainer(accelerator="cpu", fast_dev_run=1, enable_checkpointing=False, callbacks=[ModelCheckpoint()])


def test_lr_monitor_names_and_momentum_follow_lightning(recwarn):
    class TwoOptimizers(Regressor):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            for opt in self.optimizers():
                opt.zero_grad()
                self.manual_backward(nn.functional.mse_loss(self(batch[0]), batch[1]))
                opt.step()

        def on_train_epoch_end(self):
            self.lr_schedulers().step()  # manual optimisation steps its schedulers itself

        def configure_optimizers(self):
            named = torch.optim.SGD([{"params": [self.net[0].weight], "name": "w"},
                                     {"params": [self.net[0].bias], "weight_decay": 0.5}], lr=0.1, momentum=0.9)
            plain = torch.optim.Adam(self.parameters(), lr=0.01, betas=(0.8, 0.99))
            asgd = torch.optim.ASGD(self.parameters(), lr=0.02)
            sched = {"scheduler": torch.optim.lr_scheduler.StepLR(plain, 1, gamma=0.5), "name": "adam_lr"}
            return [named, plain, asgd], [sched]

    rec = Recorder()
    monitor = LearningRateMonitor(log_momentum=True, log_weight_decay=True)
    Trainer(max_epochs=2, logger=rec, callbacks=[monitor], **{k: v for k, v in quiet().items() if k != "logger"}
            ).fit(TwoOptimizers(), loader(32, 8))
    # the scheduled optimizer comes first, under its scheduler's name; param groups by name or position
    assert list(monitor.lrs) == ["adam_lr", "lr-SGD/w", "lr-SGD/pg2", "lr-ASGD"]
    assert monitor.lrs["adam_lr"] == [0.01, 0.005]
    assert monitor.last_momentum_values == {"adam_lr-momentum": 0.8, "lr-SGD/w-momentum": 0.9,
                                            "lr-SGD/pg2-momentum": 0.9, "lr-ASGD-momentum": 0.0}
    assert monitor.last_weight_decay_values["lr-SGD/pg2-weight_decay"] == 0.5
    assert rec.rows[-1][1]["lr-ASGD-momentum"] == 0.0
    assert any(w.category is RuntimeWarning and "neither momentum nor betas" in str(w.message) for w in recwarn)


def test_lr_monitor_refuses_what_it_cannot_log():
    with pytest.raises(ConfigurationError, match="this Trainer has none"):
        Trainer(max_epochs=1, callbacks=[LearningRateMonitor()], **quiet()).fit(Regressor(), loader())

    class SameGroupNames(Regressor):
        def configure_optimizers(self):
            return torch.optim.SGD([{"params": [self.net[0].weight], "name": "x"},
                                    {"params": [self.net[0].bias], "name": "x"}], lr=0.1)

    with pytest.raises(ConfigurationError, match=r"share the name\(s\) \['x'\]"):
        Trainer(max_epochs=1, logger=Recorder(), callbacks=[LearningRateMonitor()],
                **{k: v for k, v in quiet().items() if k != "logger"}).fit(SameGroupNames(), loader())


def test_model_checkpoint_writes_its_top_k_as_yaml(tmp_path):
    import yaml

    unset = ModelCheckpoint(monitor="val_loss")
    with pytest.raises(ConfigurationError, match="to_yaml.. without a path needs the callback's dirpath"):
        unset.to_yaml()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=2)
    Trainer(max_epochs=3, callbacks=[ckpt], **quiet(enable_checkpointing=True)).fit(Regressor(), loader(), loader())
    assert len(ckpt.best_k_models) == 2
    written = ckpt.to_yaml()
    assert written == str(tmp_path / "ck" / "best_k_models.yaml")
    with open(written) as f:
        assert yaml.safe_load(f) == pytest.approx({p: float(s) for p, s in ckpt.best_k_models.items()})
    elsewhere = ckpt.to_yaml(tmp_path / "top.yaml")
    with open(elsewhere) as f:
        assert set(yaml.safe_load(f)) == set(ckpt.best_k_models)
