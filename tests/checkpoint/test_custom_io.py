"""save_with/load_with: custom CheckpointIO subclasses get only the arguments their signatures take."""

from __future__ import annotations

import pytest

from torchfleet.checkpoint import AsyncCheckpointIO, CheckpointIO, load_with, save_with
from torchfleet.checkpoint import io as io_module


class TwoArgIO(CheckpointIO):
    """The seed docs' shape: save_checkpoint(checkpoint, path) and load_checkpoint(path)."""

    def __init__(self) -> None:
        self.store: dict = {}

    def save_checkpoint(self, checkpoint, path):
        self.store[str(path)] = checkpoint

    def load_checkpoint(self, path):
        return self.store[str(path)]


class KeywordIO(TwoArgIO):
    def save_checkpoint(self, checkpoint, path, *, storage_options=None):
        self.store[str(path)] = (checkpoint, storage_options)

    def load_checkpoint(self, path, map_location=None):
        return (self.store[str(path)], map_location)


class PositionalIO(TwoArgIO):
    def save_checkpoint(self, checkpoint, path, options):  # required, and named differently
        self.store[str(path)] = (checkpoint, options)

    def load_checkpoint(self, path, where):
        return (self.store[str(path)], where)


class KwargsIO(TwoArgIO):
    def save_checkpoint(self, checkpoint, path, **kwargs):
        self.store[str(path)] = (checkpoint, kwargs)

    def load_checkpoint(self, path, **kwargs):
        return (self.store[str(path)], kwargs)


def test_two_argument_subclass_works_and_dropped_options_are_logged_once(caplog):
    io = TwoArgIO()
    with caplog.at_level("WARNING", logger="torchfleet.checkpoint.io"):
        save_with(io, {"a": 1}, "p", storage_options={"acl": "private"})
        save_with(io, {"a": 2}, "q", storage_options={"acl": "private"})
        save_with(io, {"a": 3}, "r")
    assert load_with(io, "p", map_location="cpu") == {"a": 1}
    assert load_with(io, "r") == {"a": 3}
    warnings = [r.getMessage() for r in caplog.records if "storage_options" in r.getMessage()]
    assert len(warnings) == 1 and "TwoArgIO" in warnings[0]


def test_keyword_third_argument_is_passed():
    io = KeywordIO()
    save_with(io, {"a": 1}, "p", storage_options={"acl": "private"})
    assert io.store["p"] == ({"a": 1}, {"acl": "private"})
    assert load_with(io, "p", map_location="cpu")[1] == "cpu"


def test_positional_third_argument_is_passed_even_when_none():
    io = PositionalIO()
    save_with(io, {"a": 1}, "p")  # the argument is required by this signature: None is passed
    save_with(io, {"a": 2}, "q", storage_options="opts")
    assert io.store == {"p": ({"a": 1}, None), "q": ({"a": 2}, "opts")}
    assert load_with(io, "q", map_location="cpu") == (({"a": 2}, "opts"), "cpu")


def test_var_keyword_signatures_get_the_keyword():
    io = KwargsIO()
    save_with(io, {}, "p", storage_options=1)
    assert io.store["p"] == ({}, {"storage_options": 1})
    assert load_with(io, "p", map_location="cpu")[1] == {"map_location": "cpu"}


def test_signatures_are_inspected_once_per_class(monkeypatch):
    calls = []
    real = io_module.inspect.signature

    def counting(fn, *a, **k):
        calls.append(fn)
        return real(fn, *a, **k)

    class Fresh(KeywordIO):
        pass

    monkeypatch.setattr(io_module.inspect, "signature", counting)
    for _ in range(5):
        save_with(Fresh(), {}, "p")
    assert len(calls) == 1


def test_async_wraps_a_two_argument_subclass():
    inner = TwoArgIO()
    io = AsyncCheckpointIO(inner)
    save_with(io, {"a": 1}, "p")
    assert load_with(io, "p", map_location="cpu") == {"a": 1}
    io.teardown()


def test_abstract_methods_must_be_implemented():
    class Half(CheckpointIO):
        def save_checkpoint(self, checkpoint, path):
            pass

    with pytest.raises(TypeError, match="load_checkpoint"):
        Half()  # type: ignore[abstract]
