"""AsyncCheckpointIO: snapshots before returning, one save at a time, waits where it must, never loses an error."""

from __future__ import annotations

import collections
import threading
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

from torchfleet.checkpoint import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
from torchfleet.errors import CheckpointError

WAIT = 30  # seconds; a bound on Event waits so a broken implementation fails instead of hanging


class GatedIO(CheckpointIO):
    """Stores checkpoints in memory; each save blocks until the test opens the gate."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.store: dict[str, Any] = {}
        self.gate = threading.Event()
        self.started = threading.Event()
        self.active = 0
        self.max_active = 0
        self.torn_down = False
        self.fail_on = fail_on
        self._lock = threading.Lock()

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        self.started.set()
        try:
            assert self.gate.wait(WAIT)
            if self.fail_on and self.fail_on in str(path):
                raise OSError(f"bucket unreachable for {path}")
            self.store[str(path)] = checkpoint
        finally:
            with self._lock:
                self.active -= 1

    def load_checkpoint(self, path, map_location=None):
        return self.store[str(path)]

    def remove_checkpoint(self, path):
        self.store.pop(str(path), None)

    def teardown(self):
        self.torn_down = True


def _open_later(gate: threading.Event, seconds: float = 0.1) -> threading.Timer:
    timer = threading.Timer(seconds, gate.set)
    timer.start()
    return timer


def test_save_returns_before_the_write_and_snapshots_first():
    inner = GatedIO()
    io = AsyncCheckpointIO(inner)
    model = nn.Linear(4, 4)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    io.save_checkpoint({"state_dict": model.state_dict(), "step": 1}, "a.ckpt")
    assert inner.started.wait(WAIT)
    assert "a.ckpt" not in inner.store  # the write is still in flight: save did not block
    with torch.no_grad():  # training goes on mutating the parameters in place
        for p in model.parameters():
            p.add_(100.0)
    inner.gate.set()
    io.wait()
    saved = inner.store["a.ckpt"]["state_dict"]
    assert all(torch.equal(saved[k], expected[k]) for k in expected)
    assert saved["weight"].data_ptr() != model.weight.data_ptr()


class Pair(NamedTuple):
    a: torch.Tensor
    b: int


def test_snapshot_copies_nested_containers_and_keeps_shared_tensors_shared(tmp_path):
    io = AsyncCheckpointIO()  # default: TorchCheckpointIO
    shared = torch.zeros(5)
    hparams = {"lr": 0.1}
    counts = collections.defaultdict(list, {"x": [torch.ones(1)]})
    checkpoint = {
        "tied": {"encoder": shared, "decoder": shared},
        "pair": Pair(torch.ones(2), 3),
        "ordered": collections.OrderedDict(w=torch.ones(3)),
        "counts": counts,
        "hparams": hparams,
        "opt": [{"state": {0: {"exp_avg": torch.ones(2)}}}],
    }
    io.save_checkpoint(checkpoint, tmp_path / "a.ckpt")
    shared.add_(1)
    checkpoint["pair"].a.mul_(5)
    checkpoint["ordered"]["w"].zero_()
    counts["x"][0].zero_()
    counts["x"].append(torch.ones(1))
    hparams["lr"] = 99.0
    checkpoint["opt"][0]["state"][0]["exp_avg"].zero_()
    out = io.load_checkpoint(tmp_path / "a.ckpt", weights_only=False)  # a class of this test's own: trusted
    assert torch.equal(out["tied"]["encoder"], torch.zeros(5))
    assert out["tied"]["encoder"].data_ptr() == out["tied"]["decoder"].data_ptr()
    assert isinstance(out["pair"], Pair) and torch.equal(out["pair"].a, torch.ones(2)) and out["pair"].b == 3
    assert isinstance(out["ordered"], collections.OrderedDict) and torch.equal(out["ordered"]["w"], torch.ones(3))
    assert isinstance(out["counts"], collections.defaultdict) and len(out["counts"]["x"]) == 1
    assert torch.equal(out["counts"]["x"][0], torch.ones(1))
    assert out["hparams"] == {"lr": 0.1}
    assert torch.equal(out["opt"][0]["state"][0]["exp_avg"], torch.ones(2))
    io.teardown()


def test_saves_run_one_at_a_time_in_order():
    inner = GatedIO()
    io = AsyncCheckpointIO(inner)
    inner.gate.set()
    for i in range(5):
        io.save_checkpoint({"i": i}, f"{i}.ckpt")
    io.teardown()
    assert inner.max_active == 1
    assert {k: v["i"] for k, v in inner.store.items()} == {f"{i}.ckpt": i for i in range(5)}


def test_next_save_waits_for_the_previous_one():
    inner = GatedIO()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({"i": 0}, "0.ckpt")
    assert inner.started.wait(WAIT)
    timer = _open_later(inner.gate)
    io.save_checkpoint({"i": 1}, "1.ckpt")  # blocks until the gate opens and save 0 is written
    assert "0.ckpt" in inner.store
    io.wait()
    timer.join()
    assert inner.max_active == 1 and inner.store["1.ckpt"] == {"i": 1}


@pytest.mark.parametrize("call", ["teardown", "load", "remove", "wait"])
def test_calls_wait_for_the_save_in_flight(call):
    inner = GatedIO()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({"v": 1}, "a.ckpt")
    assert inner.started.wait(WAIT)
    timer = _open_later(inner.gate)
    if call == "teardown":
        io.teardown()
        assert inner.store == {"a.ckpt": {"v": 1}} and inner.torn_down
    elif call == "load":
        assert io.load_checkpoint("a.ckpt") == {"v": 1}
    elif call == "remove":
        io.remove_checkpoint("a.ckpt")  # the save finishes first, then the removal: nothing is left
        assert inner.store == {}
    else:
        io.wait()
        assert inner.store == {"a.ckpt": {"v": 1}}
    timer.join()


def test_error_surfaces_at_the_next_save_with_the_path():
    inner = GatedIO(fail_on="bad")
    inner.gate.set()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({}, "runs/bad.ckpt")
    with pytest.raises(CheckpointError, match=r"'runs/bad.ckpt'.*OSError.*bucket unreachable") as info:
        io.save_checkpoint({"v": 2}, "good.ckpt")
    assert isinstance(info.value.__cause__, OSError)
    # the failed call did not start its own save; the error is reported once, then saving works again
    assert "good.ckpt" not in inner.store
    io.save_checkpoint({"v": 2}, "good.ckpt")
    io.teardown()
    assert inner.store == {"good.ckpt": {"v": 2}}


@pytest.mark.parametrize("call", ["teardown", "load", "remove"])
def test_error_surfaces_at_teardown_load_and_remove(call):
    inner = GatedIO(fail_on="bad")
    inner.gate.set()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({}, "bad.ckpt")
    with pytest.raises(CheckpointError, match=r"'bad.ckpt'.*bucket unreachable"):
        if call == "teardown":
            io.teardown()
        elif call == "load":
            io.load_checkpoint("x")
        else:
            io.remove_checkpoint("x")
    if call == "teardown":
        assert inner.torn_down  # the wrapped IO is torn down even when the last save failed


def test_error_is_logged_when_it_happens(caplog):
    inner = GatedIO(fail_on="bad")
    inner.gate.set()
    io = AsyncCheckpointIO(inner)
    with caplog.at_level("ERROR", logger="torchfleet.checkpoint.io"):
        io.save_checkpoint({}, "bad.ckpt")
        with pytest.raises(CheckpointError):
            io.wait()
    assert any("bad.ckpt" in r.getMessage() for r in caplog.records)


def test_default_inner_io_writes_files_atomically(tmp_path):
    io = AsyncCheckpointIO()
    assert isinstance(io.checkpoint_io, TorchCheckpointIO)
    io.save_checkpoint({"w": torch.arange(6)}, tmp_path / "sub" / "a.ckpt")
    io.teardown()
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["a.ckpt"]
    assert torch.equal(TorchCheckpointIO().load_checkpoint(tmp_path / "sub" / "a.ckpt")["w"], torch.arange(6))
