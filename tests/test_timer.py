"""Trainer(max_time=...) and the Timer callback: the forms a budget takes, and bad input."""

from __future__ import annotations

from datetime import timedelta

import pytest

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
