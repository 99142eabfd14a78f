"""Checkpoints that cannot be loaded, on 2 real processes over gloo: every rank stops, and the user reads one paragraph.

A sharded (fsdp, DCP) checkpoint with a missing or cut shard, or without its ``.metadata``: the ranks
agree that the load fails before any of them starts DCP's collective read, so none waits for the others
and none prints DCP's per-rank tracebacks. A hostile file (code in its pickle) is refused by every rank
under ddp and fsdp, and its payload never runs.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest
import torch

from tests.distributed import sharded_helpers
from tests.distributed.scripts import fsdp_train
from tests.distributed.sharded_helpers import ROOT, child_env

pytestmark = [pytest.mark.distributed]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "resume_from.py")
TRAIN = os.path.join(os.path.dirname(__file__), "scripts", "fsdp_train.py")
#: lines of the combined output of both ranks: the launcher reports the first failing rank's CheckpointError once
#: (issue 19 asks for under 40 lines); DCP's own report was 90-133 lines, a missing .metadata 58
MAX_LINES = 40


class Payload:
    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 2-rank fsdp checkpoint directory (DCP files and torchfleet.pt) and a 2-rank ddp file."""
    d = tmp_path_factory.mktemp("refusals")
    cfg = {"out": str(d / "two.pt"), "devices": 2, "runs": [
        {"name": "sharded", "strategy": "fsdp", "save_at": fsdp_train.SAVE_AT, "ckpt_dir": str(d)},
        {"name": "single", "strategy": "ddp", "save_at": fsdp_train.SAVE_AT, "ckpt_dir": str(d)}]}
    sharded_helpers.load_results(cfg, sharded_helpers.run_script(TRAIN, cfg))
    return d


def resume(strategy: str, ckpt, timeout: float = 240) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, SCRIPT, json.dumps({"strategy": strategy, "ckpt": str(ckpt)})],
                          capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=ROOT)
    return proc.returncode, proc.stdout + proc.stderr


def _one_paragraph(out: str, *names: str, max_lines: int | None = MAX_LINES) -> str:
    errors = [line for line in out.splitlines() if "torchfleet.errors.CheckpointError: " in line]
    assert errors, out[-4000:]
    message = errors[-1].split("torchfleet.errors.CheckpointError: ", 1)[1]
    assert all(n in message for n in names), message
    assert "CheckpointException" not in out and "(RANK " not in out  # DCP's per-rank report
    assert "direct cause" not in out and "During handling" not in out  # no chained tracebacks
    assert out.count("Traceback (most recent call last)") <= 1, out  # the failure is reported once
    assert max_lines is None or len(out.splitlines()) <= max_lines, out
    return message


@pytest.mark.parametrize("damage", ["missing_shard", "cut_shard", "missing_metadata"])
def test_a_damaged_sharded_checkpoint_stops_every_rank_with_one_paragraph(saved, tmp_path, damage):
    ckpt = tmp_path / "damaged.ckpt"
    shutil.copytree(saved / "sharded.ckpt", ckpt)
    if damage == "missing_shard":
        (ckpt / "__1_0.distcp").unlink()
    elif damage == "cut_shard":
        data = (ckpt / "__1_0.distcp").read_bytes()
        (ckpt / "__1_0.distcp").write_bytes(data[: len(data) // 2])
    else:
        (ckpt / ".metadata").unlink()
    code, out = resume("fsdp", ckpt)
    assert code != 0
    message = _one_paragraph(out, str(ckpt), ".metadata" if damage == "missing_metadata" else "__1_0.distcp")
    assert "another checkpoint" in message


@pytest.mark.parametrize(("strategy", "layout"), [("ddp", "single"), ("fsdp", "sharded"), ("ddp", "sharded")])
def test_a_hostile_checkpoint_is_refused_by_every_rank(saved, tmp_path, strategy, layout):
    marker = tmp_path / "PAYLOAD_RAN"
    if layout == "single":
        ckpt = tmp_path / "hostile.ckpt"
        torch.save({**torch.load(saved / "single.ckpt", weights_only=True), "extra": Payload(marker)}, ckpt)
    else:  # the torchfleet.pt of a sharded directory
        ckpt = tmp_path / "hostile_dir.ckpt"
        shutil.copytree(saved / "sharded.ckpt", ckpt)
        meta = torch.load(ckpt / "torchfleet.pt", weights_only=True)
        torch.save({**meta, "extra": Payload(marker)}, ckpt / "torchfleet.pt")
    code, out = resume(strategy, ckpt)
    assert code != 0 and not marker.exists()
    message = _one_paragraph(out, "system", "weights_only=False", max_lines=None)
    assert str(ckpt) in message
