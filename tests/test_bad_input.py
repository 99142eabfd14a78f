"""Bad values of the Trainer's, fit's and the callbacks' arguments: one paragraph naming the argument, the value
and what is accepted, raised where the value is given (before any rank starts), never a Python error later."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import Regressor, loader, make_data, quiet
from torchfleet import Trainer
from torchfleet.callbacks import (
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
    RichProgressBar,
    ThroughputMonitor,
    Timer,
    TQDMProgressBar,
)
from torchfleet.errors import ConfigurationError
from torchfleet.loggers import CSVLogger


def one_paragraph(info: pytest.ExceptionInfo) -> str:
    text = str(info.value)
    assert "\n" not in text.strip(), text
    return text


@pytest.mark.parametrize(("name", "value", "accepted"), [
    ("default_root_dir", 123, "a path"),
    ("default_root_dir", ["runs"], "a path"),
    ("default_root_dir", os.path.abspath(__file__), "it is a file, not a folder"),
    ("logger", "csv", "takes a Logger object"),
    ("logger", 123, "is not a Logger"),
    ("min_steps", -1, "an int >= 0"),
    ("min_steps", 2.5, "an int >= 0"),
    ("enable_checkpointing", "yes", "True or False"),
    ("enable_progress_bar", 2, "True or False"),
    ("enable_model_summary", "no", "True or False"),
    ("use_distributed_sampler", "x", "True or False"),
    ("inference_mode", "x", "True or False"),
    ("sync_batchnorm", "x", "True or False"),
])
def test_trainer_argument_of_the_wrong_kind(name, value, accepted):
    with pytest.raises(ConfigurationError) as info:
        Trainer(**{**quiet(), name: value})
    text = one_paragraph(info)
    assert f"{name}={value!r}" in text and accepted in text


def test_a_list_of_loggers_names_the_one_that_is_not():
    with pytest.raises(ConfigurationError, match=r"holds 'tensorboard' of type str, which is not a Logger") as info:
        Trainer(**quiet(logger=[CSVLogger("unused"), "tensorboard"]))
    one_paragraph(info)


def test_minimums_above_maximums_are_refused():
    with pytest.raises(ConfigurationError, match=r"min_epochs=5 is more than max_epochs=2"):
        Trainer(**quiet(min_epochs=5, max_epochs=2))
    with pytest.raises(ConfigurationError, match=r"min_steps=10 is more than max_steps=3"):
        Trainer(**quiet(min_steps=10, max_steps=3))
    # equal, or no maximum: accepted
    assert Trainer(**quiet(min_epochs=2, max_epochs=2)).min_epochs == 2
    assert Trainer(**quiet(min_epochs=5, max_epochs=-1, max_steps=10)).min_epochs == 5
    assert Trainer(**quiet(min_steps=10, max_steps=-1)).min_steps == 10


def test_none_means_the_default_as_in_lightning():
    # Lightning programs pass None for "the default": the same Trainer as leaving the arguments out
    given = Trainer(accelerator="cpu", logger=False, log_every_n_steps=None, num_sanity_val_steps=None,
                    enable_checkpointing=None, limit_val_batches=None, min_epochs=None)
    left_out = Trainer(accelerator="cpu", logger=False)
    for name in ("log_every_n_steps", "num_sanity_val_steps", "enable_checkpointing", "limit_val_batches", "min_epochs"):
        assert getattr(given, name) == getattr(left_out, name), name
    assert left_out.log_every_n_steps == 50 and left_out.min_epochs == 0


@pytest.mark.parametrize(("cls", "kwargs", "accepted"), [
    (ModelCheckpoint, {"every_n_train_steps": -3}, "an int >= 0"),
    (ModelCheckpoint, {"every_n_epochs": 1.5}, "an int >= 0"),
    (ModelCheckpoint, {"save_top_k": "2"}, "an int >= -1"),
    (ModelCheckpoint, {"dirpath": 123}, "a path"),
    (ModelCheckpoint, {"monitor": 5}, "a str"),
    (ModelCheckpoint, {"save_last": "yes"}, "True (also write last.ckpt), False, None or 'link'"),
    (ModelCheckpoint, {"train_time_interval": -1}, "a datetime.timedelta or a number of seconds"),
    (ModelCheckpoint, {"verbose": "loud"}, "True or False"),
    (EarlyStopping, {"monitor": "val_loss", "patience": -1}, "an int >= 0"),
    (EarlyStopping, {"monitor": None}, "a str"),
    (EarlyStopping, {"monitor": "val_loss", "min_delta": "0.1"}, "a number"),
    (EarlyStopping, {"monitor": "val_loss", "stopping_threshold": "low"}, "a number or None"),
    (EarlyStopping, {"monitor": "val_loss", "strict": "yes"}, "True or False"),
    (LearningRateMonitor, {"log_momentum": "yes"}, "True or False"),
    (Timer, {"duration": "00:01:00:00", "verbose": 3}, "True or False"),
    (ThroughputMonitor, {"window_size": 0}, "an int >= 1"),
    (ThroughputMonitor, {"batch_size_fn": 32}, "a function of the batch"),
    (ThroughputMonitor, {"flops_per_batch": -5.0}, "a number >= 0"),
    (ProgressBar, {"refresh_interval": -1}, "a number >= 0"),
    (TQDMProgressBar, {"process_position": -1}, "an int >= 0"),
])
def test_callback_argument_out_of_range(cls, kwargs, accepted):
    with pytest.raises(ConfigurationError) as info:
        cls(**kwargs)
    text = one_paragraph(info)
    name, value = list(kwargs.items())[-1]
    assert f"{cls.__name__}({name}={value!r}) is not valid" in text and accepted in text


def test_rich_progress_bar_console_kwargs():
    pytest.importorskip("rich", reason="RichProgressBar needs the optional rich package")
    with pytest.raises(ConfigurationError, match=r"RichProgressBar\(console_kwargs='stderr'\) is not valid"):
        RichProgressBar(console_kwargs="stderr")


def test_timer_error_quotes_the_duration_given():
    with pytest.raises(ConfigurationError, match=r"The time budget '1 hour' \(max_time"):
        Trainer(**quiet(max_time="1 hour"))


def test_lightning_time_interval_as_a_timedelta_saves_on_time(tmp_path):
    # Lightning's ModelCheckpoint takes train_time_interval as a timedelta: a port must train and save with it
    ck = ModelCheckpoint(dirpath=tmp_path, train_time_interval=timedelta(microseconds=1), save_top_k=-1)
    trainer = Trainer(**quiet(max_steps=3, enable_checkpointing=True, callbacks=[ck]))
    trainer.fit(Regressor(), loader(n=32))
    assert sorted(os.listdir(tmp_path)) == [f"epoch=0-step={s}.ckpt" for s in (1, 2, 3)]


@pytest.mark.parametrize(("call", "kwargs", "expected"), [
    ("fit", {"ckpt_path": 123}, "trainer.fit(ckpt_path=123) is not valid: give the path of a checkpoint"),
    ("fit", {"train_dataloaders": "x"}, "trainer.fit(train_dataloaders='x') is not valid: give a "
                                        "torch.utils.data.DataLoader"),
    ("fit", {"train_dataloaders": 7}, "trainer.fit(train_dataloaders=7) is not valid"),
    ("fit", {"val_dataloaders": [None]}, "trainer.fit(val_dataloaders=None) is not valid"),
    ("fit", {"datamodule": "x"}, "trainer.fit(datamodule='x') is not valid: give a torchfleet.DataModule"),
    ("validate", {"dataloaders": 5}, "trainer.validate(dataloaders=5) is not valid"),
    ("validate", {"verbose": "yes"}, "trainer.validate(verbose='yes') is not valid: give True or False"),
    ("predict", {"return_predictions": "all"}, "trainer.predict(return_predictions='all') is not valid"),
])
def test_stage_arguments_are_refused_before_any_rank_starts(call, kwargs, expected):
    # ddp_spawn: a check made inside the ranks would surface as a ProcessFailedError, with tracebacks
    trainer = Trainer(**quiet(strategy="ddp_spawn", devices=2, max_steps=1))
    data = {} if call != "fit" or "train_dataloaders" in kwargs else {"train_dataloaders": loader(n=16)}
    if call != "fit" and "dataloaders" not in kwargs:
        data = {"dataloaders": loader(n=16)}
    with pytest.raises(ConfigurationError) as info:
        getattr(trainer, call)(Regressor(), **data, **kwargs)
    assert expected in one_paragraph(info)


def test_a_dataset_in_the_dataloaders_place_is_named():
    with pytest.raises(ConfigurationError, match=r"this is a Dataset: wrap it, train_dataloaders=DataLoader\(dataset"):
        Trainer(**quiet(max_steps=1)).fit(Regressor(), make_data(16))


def test_accepted_loader_forms_still_train():
    # an iterable of batches (not a list: a list or dict holds loaders, as in Lightning) and a dict of evaluation
    # loaders are what the loops take
    x = torch.randn(8, 8)

    class Batches:
        def __init__(self):
            self.items = [(x, torch.randn(8, 1)) for _ in range(3)]

        def __iter__(self):
            return iter(self.items)

        def __len__(self):
            return len(self.items)

    trainer = Trainer(**quiet(max_epochs=1))
    trainer.fit(Regressor(), Batches(), {"a": DataLoader(TensorDataset(x, torch.randn(8, 1)), batch_size=4)})
    assert trainer.global_step == 3

