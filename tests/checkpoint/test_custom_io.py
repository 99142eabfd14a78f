"""Custom CheckpointIO subclasses: the abstract signatures are the contract torchfleet calls."""

from __future__ import annotations

import pytest

from torchfleet.checkpoint import AsyncCheckpointIO, CheckpointIO
from torchfleet.errors import CheckpointError
from torchfleet.strategies import SingleDeviceStrategy


class StoreIO(CheckpointIO):
    """Keeps checkpoints in memory and records the optional arguments it was given."""

    def __init__(self) -> None:
        self.store: dict = {}
        self.calls: list = []

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.calls.append(("save", storage_options))
        self.store[str(path)] = checkpoint

    def load_checkpoint(self, path, map_location=None):
        self.calls.append(("load", map_location))
        return self.store[str(path)]


def test_strategy_calls_the_declared_signature():
    io = StoreIO()
    strategy = SingleDeviceStrategy(device="cpu", checkpoint_io=io)
    strategy.save_checkpoint({"a": 1}, "p", storage_options={"acl": "private"})  # Lightning's order: checkpoint, path
    assert strategy.load_checkpoint("p") == {"a": 1}
    strategy.save_state("q", {"b": 2}, storage_options="fleet")  # Fabric's (Fleet's): path, state
    assert strategy.load_state("q") == {"b": 2}
    # no map_location (an IO's default loads onto the CPU) and, as this IO takes none, no weights_only
    assert io.calls == [("save", {"acl": "private"}), ("load", None), ("save", "fleet"), ("load", None)]


def test_a_lightning_checkpoint_io_gets_lightnings_call():
    """Lightning's strategies call ``load_checkpoint(path, weights_only=...)``: an IO with Lightning's signature
    (``storage_options`` where torchfleet's has ``map_location``) gets exactly that, None included."""
    class LightningIO(StoreIO):
        def load_checkpoint(self, path, storage_options=None, weights_only=True):
            self.calls.append(("load", storage_options, weights_only))
            return self.store[str(path)]

    io = LightningIO()
    strategy = SingleDeviceStrategy(device="cpu", checkpoint_io=io)
    strategy.save_checkpoint({"a": 1}, "p")
    assert strategy.load_checkpoint("p") == {"a": 1}
    assert strategy.load_checkpoint("p", weights_only=False) == {"a": 1}
    assert io.calls == [("save", None), ("load", None, None), ("load", None, False)]


def test_weights_only_asked_of_an_io_without_it_is_one_clear_error():
    io = StoreIO()
    strategy = SingleDeviceStrategy(device="cpu", checkpoint_io=io)
    strategy.save_checkpoint({"a": 1}, "p")
    with pytest.raises(CheckpointError, match=r"weights_only=True was asked for, but StoreIO.load_checkpoint takes no"):
        strategy.load_checkpoint("p", weights_only=True)


def test_async_passes_the_optional_arguments_through():
    inner = StoreIO()
    io = AsyncCheckpointIO(inner)
    io.save_checkpoint({"a": 1}, "p", storage_options="opts")
    assert io.load_checkpoint("p", map_location="cpu") == {"a": 1}
    io.teardown()
    assert inner.calls == [("save", "opts"), ("load", "cpu")]


def test_abstract_methods_must_be_implemented():
    class Half(CheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            pass

    with pytest.raises(TypeError, match="load_checkpoint"):
        Half()  # type: ignore[abstract]
