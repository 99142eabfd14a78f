"""self.log as a ported Lightning program sees it: logged_metrics, logging from on_train_start and callbacks, steps."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf
from torchfleet.callbacks import ProgressBar
from torchfleet.errors import ConfigurationError
from torchfleet.loggers import Logger


class Recorder(Logger):
    """Keeps every ``log_metrics`` call as (step, sorted names) and every ``log_hyperparams`` call."""

    def __init__(self):
        self.calls, self.hparams = [], []

    @property
    def name(self):
        return "recorder"

    @property
    def version(self):
        return "v1234567"

    def log_metrics(self, metrics, step=None):
        self.calls.append((step, sorted(k for k in metrics if k != "epoch")))

    def log_hyperparams(self, params=None, *args, **kwargs):
        self.hparams.append(dict(params or {}))


class Model(tf.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def on_train_start(self):
        self.log("started", 7.0)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val", self.layer(batch[0]).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data():
    return DataLoader(TensorDataset(torch.randn(12, 2, generator=torch.Generator().manual_seed(0))), batch_size=2)


def _trainer(logger, **kw):
    args = dict(max_epochs=2, logger=logger, log_every_n_steps=2, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0, val_check_interval=0.5, accelerator="cpu")
    args.update(kw)
    return tf.Trainer(**args)


def test_loggers_get_lightnings_steps_and_on_train_start_joins_the_first_epoch():
    # the steps Lightning 2.6.6 gives the same program (6 batches per epoch, validation every 3, a log every 2 steps)
    recorder = Recorder()
    _trainer(recorder).fit(Model(), _data(), _data())
    assert recorder.calls == [
        (1, ["loss_step"]), (2, ["val"]), (3, ["loss_step"]), (5, ["loss_step"]), (5, ["val"]),
        (5, ["loss_epoch", "started"]),
        (7, ["loss_step"]), (8, ["val"]), (9, ["loss_step"]), (11, ["loss_step"]), (11, ["val"]), (11, ["loss_epoch"]),
    ]
    assert recorder.hparams == []  # as Lightning: no save_hyperparameters(), no log_hyperparams call


def test_logged_metrics_keep_every_name_and_each_stage_starts_empty():
    trainer = _trainer(Recorder())
    model = Model()
    trainer.fit(model, _data(), _data())
    assert set(trainer.logged_metrics) == {"loss_step", "loss_epoch", "val", "started"}
    assert {"loss", "loss_step", "loss_epoch", "val", "started"} <= set(trainer.callback_metrics)
    assert trainer.callback_metrics["loss_epoch"] == trainer.callback_metrics["loss"]  # after the epoch: its value
    trainer.validate(model, _data(), verbose=False)
    assert set(trainer.logged_metrics) == {"val"} and set(trainer.callback_metrics) == {"val"}


def test_sanity_check_values_are_not_kept():
    seen = []

    class Watch(Model):
        def training_step(self, batch, batch_idx):
            if batch_idx == 0:
                seen.append((dict(self.trainer.logged_metrics), dict(self.trainer.callback_metrics)))
            return super().training_step(batch, batch_idx)

    _trainer(Recorder(), num_sanity_val_steps=2, max_epochs=1).fit(Watch(), _data(), _data())
    assert seen == [({}, {})]


def test_callbacks_log_with_the_defaults_of_their_hook():
    class Logs(tf.Callback):
        def on_train_start(self, trainer, module):
            self.log("cb_start", 1.0)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.log("cb_batch", float(batch_idx))

        def on_train_epoch_end(self, trainer, module):
            self.log("cb_epoch", 5.0)
            with pytest.raises(ConfigurationError, match="is not useful"):
                self.log("nowhere", 1.0, on_step=False, on_epoch=False)

    recorder = Recorder()
    trainer = _trainer(recorder, callbacks=[Logs()], limit_val_batches=0, max_epochs=1)
    trainer.fit(Model(), _data())
    assert trainer.callback_metrics["cb_start"] == 1.0 and trainer.callback_metrics["cb_epoch"] == 5.0
    assert trainer.callback_metrics["cb_batch"] == 5.0  # per step by default in a batch hook: the latest
    assert "cb_epoch" in recorder.calls[-1][1] and "cb_start" in recorder.calls[-1][1]  # epoch values, at its end


def test_progress_bar_get_metrics_shows_the_version_and_prog_bar_values():
    class Bar(ProgressBar):
        def on_train_end(self, trainer, module):
            self.shown = self.get_metrics(trainer, module)

    class Shown(Model):
        def training_step(self, batch, batch_idx):
            self.log("acc", 0.5, prog_bar=True)
            return super().training_step(batch, batch_idx)

    bar = Bar()
    _trainer(Recorder(), callbacks=[bar], enable_progress_bar=True, limit_val_batches=0, max_epochs=1).fit(
        Shown(), _data())
    assert bar.shown == {"v_num": "4567", "acc": 0.5}


@pytest.mark.parametrize("value", [None, {"a": 1}, "text", [1, 2]])
def test_values_that_cannot_be_logged_name_the_call(value):
    class Bad(Model):
        def training_step(self, batch, batch_idx):
            self.log("foo", value)

    with pytest.raises(ConfigurationError, match=rf"`self\.log\(foo, {__import__('re').escape(str(value))}\)` was "
                                                 rf"called, but a value of type {type(value).__name__} cannot be logged"):
        _trainer(False, max_epochs=1).fit(Bad(), _data())


def test_loggers_are_called_with_metrics_by_keyword():
    class KeywordOnly(Recorder):
        def log_metrics(self, *, metrics, step=None):  # a Lightning logger may rely on the keyword
            super().log_metrics(metrics, step)

    recorder = KeywordOnly()
    _trainer(recorder, max_epochs=1).fit(Model(), _data(), _data())
    assert recorder.calls[0] == (1, ["loss_step"])
