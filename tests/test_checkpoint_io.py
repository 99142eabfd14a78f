"""TorchCheckpointIO writes atomically; AsyncCheckpointIO snapshots, waits and surfaces errors; custom IOs work."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from torchfleet.checkpoint import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO, load_with, save_with
from torchfleet.errors import CheckpointError


def test_round_trip_and_parent_dirs(tmp_path):
    io = TorchCheckpointIO()
    path = tmp_path / "a" / "b" / "x.ckpt"
    io.save_checkpoint({"w": torch.arange(3), "n": 1}, path)
    out = io.load_checkpoint(path)
    assert torch.equal(out["w"], torch.arange(3)) and out["n"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["x.ckpt"]  # no temp file left behind
    io.remove_checkpoint(path)
    assert not path.exists()
    io.remove_checkpoint(path)  # missing: no error


def test_crash_mid_save_keeps_previous_file(tmp_path, monkeypatch):
    io = TorchCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"version": 1}, path)

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"version": 2}, path)
    monkeypatch.undo()
    assert io.load_checkpoint(path) == {"version": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_process_killed_mid_save_keeps_previous_file(tmp_path):
    """A real process dies (os._exit) while torch.save is writing: the target still holds the old checkpoint."""
    path = tmp_path / "last.ckpt"
    TorchCheckpointIO().save_checkpoint({"version": 1}, path)
    script = textwrap.dedent(f"""
        import os, torch
        from torchfleet.checkpoint import TorchCheckpointIO
        real_save = torch.save
        def dying_save(obj, f, *a, **k):
            f.write(b"partial bytes")
            f.flush()
            os._exit(9)
        torch.save = dying_save
        TorchCheckpointIO().save_checkpoint({{"version": 2, "big": torch.zeros(1000)}}, {str(path)!r})
    """)
    result = subprocess.run([sys.executable, "-c", script])
    assert result.returncode == 9
    assert TorchCheckpointIO().load_checkpoint(path) == {"version": 1}
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "last.ckpt"]
    assert all(name.startswith(".last.ckpt.tmp-") for name in leftovers)


def test_missing_and_unreadable_files(tmp_path):
    io = TorchCheckpointIO()
    (tmp_path / "epoch=3.ckpt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"does not exist.*epoch=3.ckpt"):
        io.load_checkpoint(tmp_path / "epoch=4.ckpt")
    (tmp_path / "junk.ckpt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        io.load_checkpoint(tmp_path / "junk.ckpt")
    with pytest.raises(CheckpointError, match="directory"):
        io.load_checkpoint(tmp_path)


def test_async_snapshot_is_taken_before_training_continues(tmp_path):
    io = AsyncCheckpointIO()
    weights = torch.zeros(1000)
    io.save_checkpoint({"w": weights, "nested": [weights]}, tmp_path / "a.ckpt")
    weights.add_(1.0)  # the training loop goes on changing parameters
    io.wait()
    out = io.load_checkpoint(tmp_path / "a.ckpt")
    assert torch.equal(out["w"], torch.zeros(1000)) and torch.equal(out["nested"][0], torch.zeros(1000))


class FailingIO(CheckpointIO):
    def __init__(self):
        self.saved = []

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if "bad" in str(path):
            raise OSError("bucket unreachable")
        self.saved.append(str(path))

    def load_checkpoint(self, path, map_location=None):
        return {}


def test_async_errors_surface_at_next_save_and_teardown(tmp_path):
    inner = FailingIO()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({}, tmp_path / "bad.ckpt")
    with pytest.raises(CheckpointError, match=r"bad.ckpt.*bucket unreachable"):
        io.save_checkpoint({}, tmp_path / "good.ckpt")
    io.save_checkpoint({}, tmp_path / "good.ckpt")
    io.save_checkpoint({}, tmp_path / "bad2.ckpt")
    with pytest.raises(CheckpointError, match="bucket unreachable"):
        io.teardown()
    assert inner.saved == [str(tmp_path / "good.ckpt")]


def test_async_teardown_waits_for_the_write(tmp_path):
    io = AsyncCheckpointIO()
    io.save_checkpoint({"w": torch.randn(200_000)}, tmp_path / "big.ckpt")
    io.teardown()
    assert (tmp_path / "big.ckpt").exists() and TorchCheckpointIO().load_checkpoint(tmp_path / "big.ckpt")["w"].numel() == 200_000


class TwoArgIO(CheckpointIO):
    """The seed docs' shape: save_checkpoint(checkpoint, path), load_checkpoint(path)."""

    def __init__(self):
        self.store = {}

    def save_checkpoint(self, checkpoint, path):
        self.store[str(path)] = checkpoint

    def load_checkpoint(self, path):
        return self.store[str(path)]


def test_two_argument_subclass_through_helpers():
    io = TwoArgIO()
    save_with(io, {"a": 1}, "p", storage_options={"ignored": True})
    assert load_with(io, "p", map_location="cpu") == {"a": 1}


def test_storage_options_reach_io_that_takes_them():
    seen = {}

    class WithOptions(TwoArgIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            seen["opts"] = storage_options

    save_with(WithOptions(), {}, "p", storage_options={"acl": "private"})
    assert seen["opts"] == {"acl": "private"}
    with pytest.raises(TypeError, match="storage_options"):
        TorchCheckpointIO().save_checkpoint({}, os.devnull, storage_options={"x": 1})
