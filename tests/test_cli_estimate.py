"""`torchfleet estimate` and `torchfleet strategies --explain` (issue 23 items 3-4) through the CLI entry point, on
a small model whose model states dominate: 4 residual MLP blocks of width 256 (2,102,272 parameters), AdamW, 8 rows."""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.data import DataLoader

from tests.memory_runs import Blocks
from torchfleet import DataModule, estimate_memory
from torchfleet.cli import main
from torchfleet.planner import choose
from torchfleet.utilities.imports import package_available

WIDTH, BLOCKS, ROWS = 256, 4, 8
PARAMS = BLOCKS * (2 * WIDTH * 4 * WIDTH + 4 * WIDTH + WIDTH)  # two Linear layers per block, with biases
ARGS = ["--model", "tests.memory_runs.Blocks", f"--model.width={WIDTH}", f"--model.blocks={BLOCKS}",
        "--data", "tests.test_cli_estimate.Rows", "--trainer.accelerator=cpu", "--trainer.devices=2",
        "--trainer.logger=false"]


class Rows(DataModule):
    def train_dataloader(self):
        return DataLoader([torch.randn(ROWS, WIDTH) for _ in range(2)], batch_size=None)


def _rows(out: str) -> dict[str, list[str]]:
    """The table's rows: strategy label -> the cells after it."""
    found = {}
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 4 and re.fullmatch(r"[0-9.]+ [KMG]iB", cells[1]):
            found[cells[0]] = cells[1:]
    return found


def test_the_table_lists_the_candidates_and_marks_the_cheapest_that_fits(capsys):
    assert sum(p.numel() for p in Blocks(WIDTH, BLOCKS).parameters()) == PARAMS
    # 14 bytes per parameter: ddp's model states alone are 16 (4 params + 4 grads + 8 AdamW), fsdp x 2 holds half
    assert main(["estimate", *ARGS, "--device-memory", f"{14 * PARAMS}"]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    expected = ["ddp", "fsdp", "fsdp + activation checkpointing", "fsdp_cpu_offload"]
    if package_available("deepspeed"):
        expected += ["deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3", "deepspeed_stage_2_offload",
                     "deepspeed_stage_3_offload"]
    assert sorted(rows) == sorted(expected)
    assert rows["ddp"][2] == "no" and rows["fsdp"][2] == "yes"
    marked = [line for line in out.splitlines() if "<- cheapest that fits" in line]
    assert len(marked) == 1 and marked[0].startswith("fsdp ")  # ddp and the ZeRO 1/2 rows before it do not fit
    assert rows["ddp"][1].startswith("optimizer states")  # AdamW's 8 bytes per parameter outweigh the rest
    # the same figure as the API's, for the same model, batch, devices and precision
    ddp = estimate_memory(Blocks(WIDTH, BLOCKS), torch.randn(ROWS, WIDTH), strategy="ddp", devices=2)
    assert rows["ddp"][0] == f"{ddp.peak / 2**20:.2f} MiB"
    assert "2 device(s) x 1 node(s) = 2 rank(s)" in out


def test_without_a_gpu_or_a_size_the_table_has_no_verdict(capsys, monkeypatch):
    monkeypatch.setattr(choose, "device_memory", lambda *a, **k: None)
    assert main(["estimate", *ARGS]) == 0
    out = capsys.readouterr().out
    assert {cells[2] for cells in _rows(out).values()} == {"-"}
    assert "without a fit verdict" in out and "<- cheapest" not in out


def test_explain_says_what_auto_chooses(capsys):
    assert main(["strategies", "--explain", *ARGS, f"--device-memory={14 * PARAMS}"]) == 0
    assert "chose 'fsdp'" in capsys.readouterr().out
    assert main(["strategies", "--explain", *ARGS, "--device-memory", "1TiB"]) == 0
    out = capsys.readouterr().out
    assert "'ddp'" in out and "fits in 1.00 TiB" in out


@pytest.mark.parametrize(("text", "size"), [("80GiB", 80 * 2**30), ("80G", 80 * 2**30), ("80GB", 80 * 10**9),
                                            ("24576MiB", 24 * 2**30), ("1e9", 10**9), ("0.5 TiB", 2**39)])
def test_device_memory_sizes(text, size):
    assert choose.parse_size(text) == size


def test_a_bad_size_is_one_paragraph(capsys):
    assert main(["estimate", *ARGS, "--device-memory", "eighty"]) == 2
    assert "is not a size" in capsys.readouterr().err
