"""Errors and warnings keep our paragraph (what was given, what is accepted) and also hold Lightning's key phrase for
the same cause, so a ported ``pytest.raises(match=...)`` or warning filter still matches."""

from __future__ import annotations

import re

import pytest
import torch

from tests.helpers import RegressionData, Regressor, quiet
from torchfleet import Trainer
from torchfleet.callbacks import LearningRateMonitor, ModelCheckpoint
from torchfleet.checkpoint import TorchCheckpointIO
from torchfleet.connector import resolve
from torchfleet.environments import LocalEnvironment, SLURMEnvironment
from torchfleet.errors import ConfigurationError
from torchfleet.precision import DoublePrecision, Precision
from torchfleet.seed import seed_everything


def _raises(call, *phrases):
    with pytest.raises(ConfigurationError) as info:
        call()
    text = str(info.value)
    for phrase in phrases:
        assert re.search(phrase, text), (phrase, text)


def test_connector_messages():
    _raises(lambda: resolve(accelerator="invalid"), "Unknown accelerator 'invalid'", "Accepted accelerator names",
            re.escape("You selected an invalid accelerator name: `accelerator='invalid'`"))
    _raises(lambda: resolve(strategy="ddpp"), "Unknown strategy 'ddpp'", "Did you mean",
            re.escape("You selected an invalid strategy name: `strategy='ddpp'`"))
    _raises(lambda: resolve(precision=12), "Unknown precision 12", "Accepted values", "Precision 12 is invalid")
    _raises(lambda: resolve(accelerator="cpu", devices=0), "devices=0 is not valid for the CPU", "Accepted",
            "value is not a valid input using cpu accelerator")
    _raises(lambda: resolve(accelerator="cpu", devices=[]), "the CPU takes a count",
            "value is not a valid input using cpu accelerator")
    _raises(lambda: resolve(plugins=[Precision(), LocalEnvironment(), TorchCheckpointIO(), DoublePrecision(),
                                     SLURMEnvironment()]),
            "Received multiple values for Precision, ClusterEnvironment", "two precision plugins",
            "two cluster_environment plugins", "pass only one")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without CUDA")
def test_unavailable_accelerators():
    _raises(lambda: resolve(accelerator="cuda"), "accelerator='cuda' was requested",
            "`CUDAAccelerator` can not run on your system since the accelerator is not available")


def test_invalid_seed_environment_variable(monkeypatch):
    monkeypatch.setenv("TF_GLOBAL_SEED", "invalid")
    _raises(lambda: seed_everything(), "TF_GLOBAL_SEED='invalid' is not a seed", "Invalid seed specified")


def test_model_checkpoint_arguments():
    _raises(lambda: ModelCheckpoint(save_top_k=-3), r"save_top_k=-3", "Must be >= -1")
    _raises(lambda: ModelCheckpoint(save_top_k=3), re.escape("ModelCheckpoint(save_top_k=3, monitor=None) is not a "
                                                               "valid"), "pass monitor=")
    _raises(lambda: ModelCheckpoint(every_n_train_steps=2, every_n_epochs=1),
            "takes one of every_n_train_steps", "Combination of parameters every_n_train_steps")
    _raises(lambda: ModelCheckpoint(mode="unknown_option"), "'min' or 'max'", "`mode` can be .* but got unknown_option")


def test_learning_rate_monitor_without_a_logger():
    trainer = Trainer(max_epochs=1, callbacks=[LearningRateMonitor()], **quiet(logger=False))
    _raises(lambda: trainer.fit(Regressor(), datamodule=RegressionData()), "this Trainer has none",
            "`Trainer` that has no logger")


def test_resuming_without_a_callback_that_saved_state_warns(tmp_path):
    first = ModelCheckpoint(dirpath=tmp_path / "a", monitor="val_loss")
    second = ModelCheckpoint(dirpath=tmp_path / "b", monitor="train_loss")
    Trainer(max_epochs=1, default_root_dir=tmp_path, callbacks=[first, second],
            **quiet(enable_checkpointing=True)).fit(Regressor(), datamodule=RegressionData())
    trainer = Trainer(max_epochs=2, default_root_dir=tmp_path, callbacks=[second], **quiet(enable_checkpointing=True))
    with pytest.warns(UserWarning, match=re.escape(f"Please add the following callbacks: [{first.state_key!r}]")):
        trainer.fit(Regressor(), datamodule=RegressionData(), ckpt_path=first.best_model_path)


def test_the_timer_says_it_stops_training():
    from datetime import timedelta

    from tests.helpers import LogRecords
    from torchfleet.callbacks import Timer

    trainer = Trainer(max_epochs=3, callbacks=[Timer(timedelta(0))], **quiet())
    with LogRecords() as messages:
        trainer.fit(Regressor(), datamodule=RegressionData())
    assert trainer.global_step == 0  # a budget of 0 is spent when fit starts: no step runs (as Lightning)
    (line,) = [m for m in messages if "Timer" in m]
    assert line.startswith("Time limit reached.") and "Signaling Trainer to stop." in line and "0:00:00" in line


@pytest.mark.parametrize("name", ["limit_train_batches", "limit_val_batches", "limit_test_batches",
                                  "limit_predict_batches", "overfit_batches", "val_check_interval"])
@pytest.mark.parametrize("value", [1, 1.0])
def test_what_one_batch_and_the_whole_epoch_mean_is_logged_in_lightnings_words(caplog, name, value):
    import logging

    with caplog.at_level(logging.INFO, logger="torchfleet"):
        Trainer(**{name: value}, **quiet())
    lines = [r.getMessage() for r in caplog.records if "was configured so" in r.getMessage()]
    assert len(lines) == 1, lines  # overfit_batches=1 names itself, not the limits it sets
    assert lines[0].startswith(f"`Trainer({name}={value})` was configured so ")
    if name == "val_check_interval":
        assert ("after every batch" if value == 1 else "at the end of the training epoch") in lines[0]
    else:
        assert lines[0].split(" so ")[1].startswith("1 batch" if isinstance(value, int) else "100% of the batches")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="torchfleet"):
        Trainer(**quiet())  # the defaults say nothing
        Trainer(fast_dev_run=True, **quiet())  # nor does fast_dev_run, which sets them all to 1
    assert "was configured so" not in caplog.text


def test_val_check_interval_refusals_hold_lightnings_phrases():
    _raises(lambda: Trainer(val_check_interval=0.5, check_val_every_n_epoch=None, **quiet()),
            re.escape("`val_check_interval` should be an integer or a time-based duration (str 'DD:HH:MM:SS', "
                      "datetime.timedelta, or dict kwargs for timedelta) when `check_val_every_n_epoch=None`."),
            "val_check_interval=0.5 has no meaning there")
    # a duration counts time, across epochs: accepted with check_val_every_n_epoch=None (as Lightning)
    trainer = Trainer(val_check_interval={"minutes": 5}, check_val_every_n_epoch=None, **quiet())
    assert trainer.val_check_seconds == 300
    trainer = Trainer(max_epochs=1, limit_train_batches=4, val_check_interval=10, **quiet())
    _raises(lambda: trainer.fit(Regressor(), datamodule=RegressionData()), "val_check_interval=10 is larger than the "
            r"number of training batches per epoch \(4\)",
            "must be less than or equal to the number of the training batches")


def test_enable_checkpointing_false_with_a_model_checkpoint():
    _raises(lambda: Trainer(callbacks=[ModelCheckpoint()], **quiet(enable_checkpointing=False)),
            "`enable_checkpointing=False` but found `ModelCheckpoint`", "Remove the ModelCheckpoint, or pass "
            "enable_checkpointing=True")


def test_tensorboard_graph_of_a_module_outside_a_trainer(tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoardLogger writes its events with tensorboard")
    from torchfleet.loggers import TensorBoardLogger

    model = Regressor()
    model.example_input_array = torch.zeros(2, 8)
    logger = TensorBoardLogger(tmp_path, log_graph=True)
    logger.log_graph(model)  # torch.jit.trace reads model.trainer, which would raise outside a Trainer
    logger.save()
    assert list(tmp_path.rglob("events.out.tfevents.*"))
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):
        model.trainer  # and outside the graph's trace it still says so


@pytest.mark.parametrize("name", ["every_n_epochs", "every_n_train_steps"])
def test_model_checkpoint_intervals_below_zero(name):
    _raises(lambda: ModelCheckpoint(**{name: -3}), re.escape(f"ModelCheckpoint({name}=-3) is not valid"),
            "Must be >= 0")
    assert getattr(ModelCheckpoint(**{name: 0}), name) == 0
