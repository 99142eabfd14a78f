"""strategy="auto" that explains itself (issue 23 item 4): at fit start, with the device memory mocked (the one
function that reports it, planner.choose.device_memory), a model too big for ddp gets fsdp and one line says why; a
small one, or an unknown memory, keeps today's ddp object untouched. The launch is replaced by a recorder, so no
process starts: what is checked is the strategy the launch would have run."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader

from tests.memory_runs import Block, Blocks
from torchfleet import Trainer
from torchfleet.launchers.script import ScriptLauncher
from torchfleet.planner import choose
from torchfleet.strategies.fsdp import FSDPStrategy

WIDTH, BLOCKS, ROWS = 256, 4, 8
PARAMS = BLOCKS * (2 * WIDTH * 4 * WIDTH + 4 * WIDTH + WIDTH)


@pytest.fixture
def launched(monkeypatch):
    """The strategy each fit would have launched with."""
    seen = []

    def launch(self, function, trainer, *args, **kwargs):
        seen.append(trainer.strategy)

    monkeypatch.setattr(ScriptLauncher, "launch", launch)
    return seen


def _fit(capacity, monkeypatch, caplog):
    if capacity is not None:
        monkeypatch.setattr(choose, "device_memory", lambda *a, **k: capacity)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="auto", max_steps=1, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    before = trainer.strategy
    loader = DataLoader([torch.randn(ROWS, WIDTH) for _ in range(2)], batch_size=None)
    with caplog.at_level(logging.INFO, logger="torchfleet"):
        trainer.fit(Blocks(WIDTH, BLOCKS), loader)
    return before, trainer, [r.getMessage() for r in caplog.records if "on 2 device(s)" in r.getMessage()]


def test_a_model_too_big_for_ddp_gets_fsdp_and_the_line_says_why(monkeypatch, caplog, launched):
    # 14 bytes per parameter: ddp's AdamW model states alone are 16 (params 4 + grads 4 + states 8)
    before, trainer, lines = _fit(14 * PARAMS, monkeypatch, caplog)
    assert type(before).__name__ == "DDPStrategy"
    assert isinstance(launched[0], FSDPStrategy) and launched[0] is trainer.strategy
    assert launched[0].auto_wrap_policy == {Block} and not launched[0].cpu_offload  # the repeated blocks are units
    assert (launched[0].num_processes, launched[0].precision.name) == (2, "32-true")
    assert len(lines) == 1 and "chose 'fsdp'" in lines[0] and "ddp (" in lines[0]
    assert f"{14 * PARAMS / 2**20:.2f} MiB per device" in lines[0]


def test_when_sharding_does_not_fit_either_offload_is_chosen(monkeypatch, caplog, launched):
    # 8 bytes per parameter: fsdp x 2 holds 8 of model states plus whole blocks while they run; offload holds none
    _, _, lines = _fit(8 * PARAMS, monkeypatch, caplog)
    assert isinstance(launched[0], FSDPStrategy) and launched[0].cpu_offload
    assert "chose 'fsdp_cpu_offload'" in lines[0] and "fsdp (" in lines[0]


def test_a_model_that_fits_keeps_todays_strategy(monkeypatch, caplog, launched):
    before, trainer, lines = _fit(2**40, monkeypatch, caplog)
    assert launched == [before] and trainer.strategy is before and lines == []


def test_unknown_memory_estimates_nothing(monkeypatch, caplog, launched):
    called = []
    monkeypatch.setattr(choose, "choose_auto", lambda *args, **kwargs: called.append(args))
    before, trainer, lines = _fit(None, monkeypatch, caplog)  # the CPU's memory is unknown
    assert called == [] and launched == [before] and lines == []


def test_a_model_the_estimate_cannot_trace_trains_under_todays_strategy(monkeypatch, caplog, launched):
    def fail(*args, **kwargs):
        raise RuntimeError("an operator fake tensors do not support")

    monkeypatch.setattr(choose, "choose_auto", fail)
    before, trainer, _ = _fit(2**40, monkeypatch, caplog)
    assert launched == [before] and trainer.strategy is before
    said = [r.getMessage() for r in caplog.records if "the memory estimate failed" in r.getMessage()]
    assert len(said) == 1 and "RuntimeError: an operator fake tensors do not support" in said[0]
