"""Checkpoints that cannot be loaded, on 2 real processes over gloo: every rank stops, and the user reads one paragraph.

A sharded (fsdp, DCP) checkpoint with a missing or cut shard, or without its ``.metadata``: the ranks
agree that the load fails before any of them starts DCP's collective read, so none waits for the others
and none prints DCP's per-rank tracebacks. A checkpoint that is not whole and one save's (a shard copied from
another run, a ``.metadata`` edited to cover fewer rows or another shape, a shard cut short) is refused before
any training by fit in one process, a 4-rank fsdp resume, ``load_from_checkpoint`` and ``torchfleet consolidate``. A hostile file (code in its pickle) is refused by every rank
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
REFUSE_EACH = os.path.join(os.path.dirname(__file__), "scripts", "refuse_each.py")
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
        {"name": "single", "strategy": "ddp", "save_at": fsdp_train.SAVE_AT, "ckpt_dir": str(d)},
        # another run's save, whose shards a damaged copy of "sharded" borrows
        {"name": "other", "strategy": "fsdp", "save_at": fsdp_train.SAVE_AT + 2, "ckpt_dir": str(d)}]}
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
    # torch 2.8's gloo prints a "[Gloo] Rank N is connected to ..." line per peer: torch's, not the report's
    ours = [line for line in out.splitlines() if not line.startswith("[Gloo] ")]
    assert max_lines is None or len(ours) <= max_lines, out
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


#: damaged copies of the 2-rank fsdp checkpoint, refused by every way of loading it
FOREIGN = ("copied_shard", "fewer_rows", "other_shape", "cut_shard")


def _edit_metadata(ckpt, damage: str) -> str:
    """Rewrite ``.metadata`` (a trusted file here) so that one row-sharded weight's chunks no longer tile its shape."""
    import dataclasses
    import pickle

    with open(ckpt / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    key = next(k for k, v in metadata.state_dict_metadata.items()
               if k.startswith("state_dict.") and len(getattr(v, "size", ())) == 2 and len(v.chunks) == 2)
    item = metadata.state_dict_metadata[key]
    rows, cols = item.size
    if damage == "fewer_rows":  # the second rank's chunk shrunk by half its rows
        last = item.chunks[-1]
        item.chunks[-1] = dataclasses.replace(last, sizes=torch.Size([last.sizes[0] // 2, cols]))
    else:  # the tensor declared a column wider than its chunks
        metadata.state_dict_metadata[key] = dataclasses.replace(item, size=torch.Size([rows, cols + 1]))
    with open(ckpt / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    return key


@pytest.fixture(scope="module")
def foreign(saved, tmp_path_factory):
    """Each damage applied to a copy of the fsdp checkpoint: {damage: (path, the words its refusal must hold)}."""
    d = tmp_path_factory.mktemp("foreign")
    made = {}
    for damage in FOREIGN:
        ckpt = d / f"{damage}.ckpt"
        shutil.copytree(saved / "sharded.ckpt", ckpt)
        shard = ckpt / "__1_0.distcp"
        if damage == "copied_shard":
            other = saved / "other.ckpt" / "__1_0.distcp"
            assert other.read_bytes() != shard.read_bytes()
            shutil.copyfile(other, shard)
            made[damage] = (ckpt, [str(shard), "another run or save"])
        elif damage == "cut_shard":
            shard.write_bytes(shard.read_bytes()[:-100])
            made[damage] = (ckpt, [str(shard), "bytes"])
        else:
            key = _edit_metadata(ckpt, damage)
            made[damage] = (ckpt, [str(ckpt / ".metadata"), repr(key), "unwritten"])
    return made


def _refused(message: str, ckpt, words) -> None:
    assert str(ckpt) in message and all(w in message for w in words), message
    assert "weights_only" not in message and "\n" not in message.strip(), message


@pytest.fixture(scope="module")
def four_rank_resumes(foreign, tmp_path_factory):
    """One 4-rank fsdp launch (torchrun, so the ranks outlive each refusal) resuming from each damaged checkpoint in
    turn, at another world size than the save's: {rank: {path: {"error", "global_step"}}}."""
    out = tmp_path_factory.mktemp("four")
    cfg = {"ckpts": [str(path) for path, _ in foreign.values()], "out": str(out)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           REFUSE_EACH, json.dumps(cfg)], capture_output=True, text=True, timeout=240,
                          env=child_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return {rank: json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(4)}


@pytest.mark.parametrize("damage", FOREIGN)
def test_a_checkpoint_that_is_not_whole_or_one_saves_is_refused_by_every_load(foreign, four_rank_resumes, tmp_path,
                                                                              capsys, damage):
    from torchfleet.cli import main
    from torchfleet.errors import CheckpointError

    ckpt, words = foreign[damage]
    for rank, tried in four_rank_resumes.items():  # every rank refused before training, with the same paragraph
        assert tried[str(ckpt)]["global_step"] == 0, rank
        assert tried[str(ckpt)]["error"] == four_rank_resumes[0][str(ckpt)]["error"], rank
    _refused(four_rank_resumes[0][str(ckpt)]["error"], ckpt, words)
    model, trainer, train, val = fsdp_train.build("auto", 1)
    with pytest.raises(CheckpointError) as fit:
        trainer.fit(model, train, val, ckpt_path=ckpt)
    _refused(str(fit.value), ckpt, words)
    assert trainer.global_step == 0
    with pytest.raises(CheckpointError) as loaded:
        fsdp_train.TinyTransformer.load_from_checkpoint(ckpt)
    _refused(str(loaded.value), ckpt, words)
    assert main(["consolidate", str(ckpt), str(tmp_path / "whole.ckpt")]) != 0
    _refused(" ".join(capsys.readouterr().err.split()), ckpt, words)
    assert not (tmp_path / "whole.ckpt").exists()
