"""Trainer(max_time=...) and the Timer callback: the forms a budget takes, and bad input."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from tests.helpers import quiet
from torchfleet import Trainer
from torchfleet.callbacks import Timer
from torchfleet.errors import ConfigurationError


@pytest.mark.parametrize("given", ["00:01:02:03", timedelta(hours=1, minutes=2, seconds=3), {"hours": 1, "seconds": 123}])
def test_budget_forms(given):
    trainer = Trainer(max_time=given, **quiet(accelerator="cpu"))
    timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
    assert timer.duration == 3723.0
    assert trainer.max_epochs == -1  # the budget alone ends the run


@pytest.mark.parametrize("given", ["12:00", "a:b:c:d", {"hour": 1}, 5, timedelta(seconds=-1)])
def test_bad_budget_is_refused_before_anything_runs(given):
    with pytest.raises(ConfigurationError, match="DD:HH:MM:SS"):
        Trainer(max_time=given, **quiet(accelerator="cpu"))


def test_max_time_and_a_timer_callback_conflict():
    with pytest.raises(ConfigurationError, match="Remove one"):
        Trainer(max_time="00:00:01:00", callbacks=[Timer("00:00:02:00")], **quiet(accelerator="cpu"))
    with pytest.raises(ConfigurationError, match="interval"):
        Timer("00:00:01:00", interval="batch")


def test_timer_clocks_each_stage(monkeypatch):
    import torchfleet.trainer.callbacks.timer as timer_module
    from tests.helpers import Regressor, loader

    clock = iter(float(t) for t in range(100, 10_000, 10))  # each reading of the clock is 10 s after the last
    monkeypatch.setattr(timer_module, "_now", lambda: next(clock))
    timer = Timer(duration={"hours": 1})
    assert timer.start_time() is None and timer.time_elapsed("validate") == 0.0 and timer.time_remaining() == 3600
    trainer = Trainer(max_epochs=1, limit_train_batches=2, callbacks=[timer], **quiet(accelerator="cpu"))
    trainer.fit(Regressor(), loader(), loader())
    train_span = timer.end_time("train") - timer.start_time("train")
    val_span = timer.end_time("validate") - timer.start_time("validate")
    assert train_span > val_span > 0  # validation ran inside the training span
    assert timer.time_elapsed() == timer.time_elapsed("train") == train_span
    assert timer.time_remaining() == 3600 - train_span
    assert timer.time_elapsed("test") == 0.0 and timer.end_time("test") is None
    trainer.test(Regressor(), loader())
    assert timer.time_elapsed("test") == timer.end_time("test") - timer.start_time("test") > 0
    with pytest.raises(ConfigurationError, match="Timer stage 'sanity' is not one it clocks"):
        timer.time_elapsed("sanity")


def test_a_resumed_run_whose_budget_is_spent_trains_no_step(tmp_path):
    from tests.helpers import RegressionData, Regressor
    from torchfleet.callbacks import ModelCheckpoint

    timer = Timer(timedelta(seconds=3600))
    ck = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = Trainer(max_steps=3, callbacks=[timer, ck], default_root_dir=tmp_path, **quiet(enable_checkpointing=True))
    first.fit(Regressor(), datamodule=RegressionData())
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)["callbacks"]
    state["Timer"]["time_elapsed"] = 7200.0  # the budget was spent by the time of this checkpoint
    torch.save({**torch.load(tmp_path / "last.ckpt", weights_only=True), "callbacks": state}, tmp_path / "spent.ckpt")
    resumed = Trainer(max_epochs=5, callbacks=[Timer(timedelta(seconds=3600))], default_root_dir=tmp_path, **quiet())
    resumed.fit(Regressor(), datamodule=RegressionData(), ckpt_path=tmp_path / "spent.ckpt")
    assert resumed.global_step == first.global_step == 3  # stopped before its first step, as Lightning
