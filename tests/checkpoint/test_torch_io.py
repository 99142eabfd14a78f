"""TorchCheckpointIO: round trips, atomic writes under crashes, and errors that name the path."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from torchfleet.checkpoint import TorchCheckpointIO
from torchfleet.checkpoint.io import is_temp_file
from torchfleet.errors import CheckpointError

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")


def _others(directory: pathlib.Path, keep: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != keep)


def test_round_trip_creates_parents_and_leaves_no_temp_file(tmp_path):
    io = TorchCheckpointIO()
    path = tmp_path / "run" / "checkpoints" / "epoch=1.ckpt"
    state = {"state_dict": {"w": torch.randn(3, 3), "step": torch.tensor(7)}, "epoch": 1, "nested": [1, "a", (2.5,)]}
    io.save_checkpoint(state, path)
    out = io.load_checkpoint(str(path))  # str and PathLike both work
    assert torch.equal(out["state_dict"]["w"], state["state_dict"]["w"])
    assert out["state_dict"]["step"].item() == 7 and out["epoch"] == 1 and out["nested"] == [1, "a", (2.5,)]
    assert _others(path.parent, path.name) == []


def test_overwrite_replaces_the_previous_checkpoint(tmp_path):
    io = TorchCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"v": 1}, path)
    io.save_checkpoint({"v": 2}, path)
    assert io.load_checkpoint(path) == {"v": 2}
    assert _others(tmp_path, "last.ckpt") == []


def test_map_location_is_passed_to_torch_load(tmp_path):
    io = TorchCheckpointIO()
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "a.pt")
    assert io.load_checkpoint(tmp_path / "a.pt", map_location="meta")["w"].device.type == "meta"


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_failure_halfway_keeps_the_previous_file_and_cleans_up(tmp_path, monkeypatch, error):
    io = TorchCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"v": 1, "w": torch.arange(4)}, path)
    real_save = torch.save

    def save_half_then_fail(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.truncate(f.tell() // 2)  # half a file on disk, then the failure
        raise error

    monkeypatch.setattr(torch, "save", save_half_then_fail)
    with pytest.raises(type(error)):
        io.save_checkpoint({"v": 2, "w": torch.arange(1000)}, path)
    monkeypatch.undo()
    out = io.load_checkpoint(path)
    assert out["v"] == 1 and torch.equal(out["w"], torch.arange(4))
    assert _others(tmp_path, "last.ckpt") == []


def _killed_save(path: pathlib.Path) -> subprocess.CompletedProcess:
    """Run a process that dies (os._exit) after writing part of a checkpoint to ``path``."""
    script = textwrap.dedent(f"""
        import os, torch
        from torchfleet.checkpoint import TorchCheckpointIO
        real_save = torch.save
        def dying_save(obj, f, *a, **k):
            real_save(obj, f, *a, **k)
            f.truncate(f.tell() // 2)
            f.flush()
            os._exit(17)
        torch.save = dying_save
        TorchCheckpointIO().save_checkpoint({{"v": 2, "big": torch.zeros(10_000)}}, {str(path)!r})
    """)
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)


def test_process_killed_mid_write_leaves_previous_checkpoint_and_a_recognisable_temp(tmp_path):
    io = TorchCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"v": 1}, path)
    # a second target that had no previous version: after the crash it must not exist at all
    fresh = tmp_path / "fresh.ckpt"
    result = _killed_save(path)
    assert result.returncode == 17, result.stderr
    assert _killed_save(fresh).returncode == 17
    assert io.load_checkpoint(path) == {"v": 1}
    assert not fresh.exists()
    leftovers = _others(tmp_path, "last.ckpt")
    assert len(leftovers) == 2 and all(is_temp_file(name) and name.startswith(".") for name in leftovers)
    # the leftovers are not offered as checkpoints when a path is missing
    with pytest.raises(CheckpointError) as info:
        io.load_checkpoint(tmp_path / "other.ckpt")
    assert "last.ckpt" in str(info.value) and ".tmp-" not in str(info.value)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_next_save_removes_what_killed_saves_left_but_never_a_live_save(tmp_path):
    io = TorchCheckpointIO()
    assert _killed_save(tmp_path / "a.ckpt").returncode == 17
    (killed,) = _others(tmp_path, "")
    host = killed.rsplit("@", 1)[1]  # temp names say which machine wrote them
    dead = _dead_pid()
    legacy = f".e.ckpt.tmp-{dead}"  # an older torchfleet's name for it: no count, no machine
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        live = [f".b.ckpt.tmp-{sleeper.pid}-0@{host}",  # another process on this machine, still writing
                f".c.ckpt.tmp-{os.getpid()}-99@{host}",  # this process (another thread, an async save)
                f".d.ckpt.tmp-{dead}-0@another-machine"]  # a folder shared with a machine whose processes we cannot see
        for name in [*live, legacy]:
            (tmp_path / name).write_bytes(b"partial")
        io.save_checkpoint({"v": 1}, tmp_path / "z.ckpt")
        assert _others(tmp_path, "z.ckpt") == sorted(live)
        assert io.load_checkpoint(tmp_path / "z.ckpt") == {"v": 1}
    finally:
        sleeper.kill()
        sleeper.wait()


def test_is_temp_file_does_not_match_real_checkpoints():
    assert not is_temp_file("epoch=3-step=100.ckpt")
    assert not is_temp_file("last.ckpt")
    assert not is_temp_file(".hidden.ckpt")
    assert is_temp_file("/a/b/.last.ckpt.tmp-123-4")
    assert is_temp_file("/a/b/.last.ckpt.tmp-123-4@node-7.cluster")


def test_missing_path_names_it_and_lists_nearby_checkpoints(tmp_path):
    io = TorchCheckpointIO()
    for i in range(7):
        (tmp_path / f"epoch={i}.ckpt").write_bytes(b"x")
        os.utime(tmp_path / f"epoch={i}.ckpt", (1000 + i, 1000 + i))
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    target = tmp_path / "epoch=9.ckpt"
    with pytest.raises(CheckpointError) as info:
        io.load_checkpoint(target)
    text = str(info.value)
    assert str(target) in text and "does not exist" in text
    listed = [f"epoch={i}.ckpt" for i in range(7) if f"epoch={i}.ckpt" in text]
    assert listed == [f"epoch={i}.ckpt" for i in range(2, 7)]  # the 5 newest only
    assert "notes.txt" not in text


def test_missing_directory_is_said(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist either"):
        TorchCheckpointIO().load_checkpoint(tmp_path / "nowhere" / "a.ckpt")


@pytest.mark.parametrize("content, reason", [(b"this is text", "torch.load failed"), (b"", "empty")])
def test_unreadable_file_is_not_a_checkpoint(tmp_path, content, reason):
    path = tmp_path / "junk.ckpt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="not a readable checkpoint") as info:
        TorchCheckpointIO().load_checkpoint(path)
    assert str(path) in str(info.value) and reason in str(info.value)


def test_directory_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="is a directory"):
        TorchCheckpointIO().load_checkpoint(tmp_path)


class Hyper:
    """An arbitrary object in a checkpoint (hyperparameters), which weights_only loading refuses."""

    def __init__(self) -> None:
        self.lr = 0.1


def test_weights_only_refusal_explains_how_to_load(tmp_path):
    path = tmp_path / "a.ckpt"
    TorchCheckpointIO().save_checkpoint({"hparams": Hyper()}, path)
    with pytest.raises(CheckpointError, match=r"'tests.checkpoint.test_torch_io.Hyper'.*weights_only=False"):
        TorchCheckpointIO().load_checkpoint(path)  # safe by default
    assert TorchCheckpointIO(weights_only=False).load_checkpoint(path)["hparams"].lr == 0.1
    assert TorchCheckpointIO().load_checkpoint(path, weights_only=False)["hparams"].lr == 0.1
    TorchCheckpointIO().save_checkpoint({"w": torch.ones(2)}, path)  # tensors only: weights_only loads it
    assert torch.equal(TorchCheckpointIO(weights_only=True).load_checkpoint(path)["w"], torch.ones(2))


def test_storage_options_are_refused_by_local_files(tmp_path):
    with pytest.raises(TypeError, match="storage_options"):
        TorchCheckpointIO().save_checkpoint({}, tmp_path / "a.ckpt", storage_options={"acl": "private"})
    assert not (tmp_path / "a.ckpt").exists()


def test_remove_checkpoint_file_directory_and_missing(tmp_path):
    io = TorchCheckpointIO()
    io.save_checkpoint({"v": 1}, tmp_path / "a.ckpt")
    sharded = tmp_path / "sharded.ckpt"
    (sharded / "inner").mkdir(parents=True)
    (sharded / "inner" / "0.distcp").write_bytes(b"x")
    io.remove_checkpoint(tmp_path / "a.ckpt")
    io.remove_checkpoint(sharded)
    io.remove_checkpoint(tmp_path / "never-there.ckpt")  # no error
    assert list(tmp_path.iterdir()) == []
