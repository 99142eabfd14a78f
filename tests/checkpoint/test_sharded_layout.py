"""The sharded checkpoint directory layout: marker, meta file, atomic replacement (one process)."""

from __future__ import annotations

import os

import pytest
import torch

from torchfleet.checkpoint import distributed as sharded
from torchfleet.checkpoint.distributed import (
    META_NAME,
    atomic_checkpoint_dir,
    checkpoint_layout,
    is_sharded_checkpoint,
    partial_dir,
    read_meta,
    sharded_marker,
    write_meta,
)
from torchfleet.errors import CheckpointError
from torchfleet.strategies.single_device import SingleDeviceStrategy


def _save(path, epoch, strategy=None, layout="dcp"):
    with atomic_checkpoint_dir(path, strategy or SingleDeviceStrategy()) as tmp:
        with open(os.path.join(tmp, "payload"), "w") as f:
            f.write(str(epoch))
        write_meta(tmp, {"torchfleet": sharded_marker(layout), "epoch": epoch})


def test_save_writes_meta_last_and_replaces_the_previous_checkpoint(tmp_path):
    path = tmp_path / "ckpts" / "last.ckpt"  # the parent does not exist yet
    _save(path, 0)
    assert is_sharded_checkpoint(path) and checkpoint_layout(path) == "dcp"
    assert read_meta(path)["epoch"] == 0
    _save(path, 1, layout="deepspeed")
    assert read_meta(path)["epoch"] == 1 and checkpoint_layout(path) == "deepspeed"
    assert (path / "payload").read_text() == "1"
    # nothing is left beside it: no partial, no aside copy
    assert sorted(os.listdir(path.parent)) == ["last.ckpt"]


def test_a_save_that_raises_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    _save(path, 0)
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_checkpoint_dir(path, SingleDeviceStrategy()) as tmp:
            (open(os.path.join(tmp, "payload"), "w")).close()
            raise RuntimeError("disk full")
    assert read_meta(path)["epoch"] == 0
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]


def test_a_save_without_meta_is_discarded(tmp_path):
    path = tmp_path / "x.ckpt"
    _save(path, 0)
    with pytest.raises(CheckpointError, match="without writing torchfleet.pt"):
        with atomic_checkpoint_dir(path, SingleDeviceStrategy()):
            pass
    assert read_meta(path)["epoch"] == 0


def test_a_crashed_save_leftover_is_cleared_and_ignored(tmp_path):
    path = tmp_path / "x.ckpt"
    _save(path, 0)
    leftover = partial_dir(path)
    os.makedirs(leftover)
    (open(os.path.join(leftover, "__1_0.distcp"), "w")).close()
    assert read_meta(path)["epoch"] == 0  # the leftover does not disturb loading
    _save(path, 1)
    assert not os.path.exists(leftover) and read_meta(path)["epoch"] == 1


def test_previous_checkpoint_left_aside_between_two_renames_is_restored(tmp_path, monkeypatch):
    # where no atomic swap exists, a crash between "rename old aside" and "rename new in" leaves only the aside copy
    monkeypatch.setattr(sharded, "_exchange", lambda a, b: False)
    path = tmp_path / "x.ckpt"
    _save(path, 0)
    _save(path, 1)  # the two-rename path works on its own
    assert read_meta(path)["epoch"] == 1
    os.rename(path, sharded._aside_dir(str(path)))
    _save(path, 2)
    assert read_meta(path)["epoch"] == 2 and sorted(os.listdir(tmp_path)) == ["x.ckpt"]


def test_a_file_checkpoint_at_the_path_is_replaced_by_the_directory(tmp_path):
    path = tmp_path / "x.ckpt"
    torch.save({"state_dict": {}}, path)
    _save(path, 3)
    assert is_sharded_checkpoint(path) and read_meta(path)["epoch"] == 3


def test_layout_errors_name_what_is_wrong(tmp_path):
    with pytest.raises(CheckpointError, match="not a sharded checkpoint directory: the path is missing"):
        checkpoint_layout(tmp_path / "nope")
    incomplete = tmp_path / "incomplete.ckpt"
    incomplete.mkdir()
    (incomplete / ".metadata").touch()
    (incomplete / "__0_0.distcp").touch()
    assert not is_sharded_checkpoint(incomplete)
    with pytest.raises(CheckpointError, match="interrupted before it finished.*resume from an earlier"):
        checkpoint_layout(incomplete)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    torch.save({"torchfleet": {"format": 2, "layout": "zarr"}}, foreign / META_NAME)
    with pytest.raises(CheckpointError, match="names no known layout"):
        checkpoint_layout(foreign)
    with pytest.raises(ValueError, match="layout"):
        write_meta(foreign, {"epoch": 1})
