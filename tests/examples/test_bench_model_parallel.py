"""bench/model_parallel.py's PP2xDP2 pair trains the example's GPT rearranged into one Sequential (what pipeline
stages need): it must hold the example's initial weights, compute its forward, and split where the bench says."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from torchfleet.examples.tp_transformer import GPT, Config
from torchfleet.strategies import PipelineSpec
from torchfleet.strategies._pipeline import stage_children

BENCH = Path(__file__).resolve().parents[2] / "bench"
CFG = Config(vocab=64, dim=32, heads=4, layers=4, seq=8, hidden=64)


@pytest.fixture
def common(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the bench's scripts import their helpers by bare name
    module = importlib.import_module("_mp_common")
    yield module
    for name in ("_mp_common", "_ddp_common"):
        sys.modules.pop(name, None)


def test_gpt_sequential_is_the_examples_gpt(common):
    layers = common.gpt_sequential(CFG)
    torch.manual_seed(0)  # as the example's Module builds its GPT
    gpt = GPT(CFG)
    ours, theirs = list(layers.parameters()), list(gpt.parameters())
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
    tokens = torch.randint(0, CFG.vocab, (2, CFG.seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(layers(tokens), gpt(tokens))


def test_the_split_makes_two_stages_of_half_the_blocks(common):
    holder = nn.Module()
    holder.layers = common.gpt_sequential(CFG)
    spec = PipelineSpec(split_points=[f"layers.{common.split_point(CFG)}"], loss_fn=common.token_loss)
    parent, stages = stage_children(holder, spec, 2)
    assert parent == "layers"
    assert stages == [["tok_embeddings", "block0", "block1"], ["block2", "block3", "norm", "output"]]


def test_pipeline_sizes_of_the_variants(common):
    assert [common.pipeline_size(v) for v in ("raw_pp2dp2", "pp2dp2", "tp2dp2", "ddp")] == [2, 2, 1, 1]
    assert common.mesh_shape("pp2dp2", 4) == (2, 1)
    assert common.mesh_shape("raw_tp2dp2", 4) == (2, 2)
    assert common.mesh_shape("fsdp", 4) == (4, 1)
