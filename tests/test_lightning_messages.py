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
