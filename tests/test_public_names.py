"""Names ported Lightning code imports: torchfleet.Callback, torchfleet.utilities and torchfleet.plugins (the
demos: tests/test_demos.py)."""

from __future__ import annotations

import warnings

import pytest

import torchfleet
from tests.helpers import LogRecords, quiet
from torchfleet import Trainer
from torchfleet.utilities import rank_zero_debug, rank_zero_info, rank_zero_only, rank_zero_warn


def test_top_level_callback_and_plugins():
    from torchfleet.callbacks import Callback

    assert torchfleet.Callback is Callback
    from torchfleet.plugins import (
        AsyncCheckpointIO,
        CheckpointIO,
        MixedPrecision,
        Precision,
        TorchCheckpointIO,
    )
    from torchfleet.plugins.environments import LightningEnvironment, SLURMEnvironment

    assert issubclass(TorchCheckpointIO, CheckpointIO) and issubclass(AsyncCheckpointIO, CheckpointIO)
    assert issubclass(MixedPrecision, Precision)
    assert SLURMEnvironment is torchfleet.environments.SLURMEnvironment
    assert LightningEnvironment is torchfleet.environments.LocalEnvironment
    # a plugin from this module is taken by the Trainer
    trainer = Trainer(plugins=[TorchCheckpointIO()], **quiet())
    assert isinstance(trainer.strategy.checkpoint_io, TorchCheckpointIO)


def test_rank_zero_helpers(monkeypatch):
    calls = []

    @rank_zero_only
    def record(x):
        calls.append(x)
        return x

    assert rank_zero_only.rank == 0 and record(1) == 1
    with LogRecords() as messages, pytest.warns(UserWarning, match="careful"):
        rank_zero_info("hello %s", "there")
        rank_zero_warn("careful")
        rank_zero_debug("not shown at INFO")
    assert messages == ["hello there"]
    monkeypatch.setenv("RANK", "1")  # as torchrun sets it, before any process group exists
    assert rank_zero_only.rank == 1
    assert record(2) is None and calls == [1]
    with LogRecords() as messages, warnings.catch_warnings():
        warnings.simplefilter("error")
        rank_zero_info("hidden")
        rank_zero_warn("hidden")
    assert messages == []
    rank_zero_only.rank = 0  # set explicitly, as Lightning's strategies do
    try:
        assert record(3) == 3
    finally:
        rank_zero_only.rank = None
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert rank_zero_only.rank == 1


def test_banner_prints_on_rank_zero_only(capsys, monkeypatch):
    # ported examples call Lightning's cli_lightning_logo() before their CLI: the import line alone changes
    from torchfleet import cli_lightning_logo, cli_logo

    assert cli_lightning_logo is cli_logo
    cli_lightning_logo()
    out = capsys.readouterr().out
    assert torchfleet.__version__ in out and len(out.splitlines()) >= 5
    monkeypatch.setenv("RANK", "1")
    cli_logo()
    assert capsys.readouterr().out == ""
