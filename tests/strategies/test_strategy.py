"""Strategy base behaviour on one process: collectives are identities, batches move, state round-trips."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from torch import nn

from torchfleet.errors import CheckpointError, ConfigurationError
from torchfleet.strategies import SingleDeviceStrategy
from torchfleet.strategies.utils import move_to_device


def test_collectives_are_identities_on_one_device():
    s = SingleDeviceStrategy(device="cpu")
    t = torch.arange(3.0)
    # Lightning's signature: reduce(tensor, group=None, reduce_op="mean"), "avg" and torch's ReduceOp accepted
    assert s.reduce(t) is t and s.reduce(t, reduce_op="sum") is t and s.reduce(t, None, "avg") is t
    assert s.reduce(t, reduce_op=torch.distributed.ReduceOp.MAX) is t
    assert s.all_gather(t).shape == (1, 3) and s.all_gather(t, None, sync_grads=False).shape == (1, 3)
    assert s.broadcast({"a": 1}) == {"a": 1}
    s.barrier("x")
    assert s.reduce_boolean_decision(True) is True and s.reduce_boolean_decision(False, all=False) is False
    with pytest.raises(ConfigurationError, match="'median'.*'mean', 'sum', 'max', 'min'"):
        s.reduce(t, reduce_op="median")


def test_move_to_device_keeps_structure():
    Pair = namedtuple("Pair", "x y")
    batch = {"a": [torch.ones(1), (torch.zeros(2), "text")], "b": Pair(torch.ones(1), 3)}
    out = move_to_device(batch, torch.device("meta"))
    assert out["a"][0].device.type == "meta" and out["a"][1][0].device.type == "meta"
    assert out["a"][1][1] == "text" and isinstance(out["b"], Pair) and out["b"].y == 3
    cpu = [torch.ones(1), torch.ones(2)]
    assert move_to_device(cpu, torch.device("cpu")) is cpu  # nothing to move: the same object


def test_save_and_load_checkpoint_round_trip(tmp_path):
    s = SingleDeviceStrategy(device="cpu")
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    s.save_state(tmp_path / "c.pt", {"model": model, "opt": opt, "step": 7})
    fresh = nn.Linear(3, 2)
    fresh_opt = torch.optim.Adam(fresh.parameters())
    out = s.load_state(tmp_path / "c.pt", {"model": fresh, "opt": fresh_opt})
    assert out["step"] == 7
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_opt.state_dict()["state"][0]["step"] == 1
    with pytest.raises(CheckpointError, match="no entry 'other'"):
        s.load_state(tmp_path / "c.pt", {"other": fresh})
    with pytest.raises(CheckpointError, match=r"weight.*\(2, 3\).*\(5, 3\)"):
        s.load_state(tmp_path / "c.pt", {"model": nn.Linear(3, 5)})


def test_single_device_refuses_several_devices():
    s = SingleDeviceStrategy()
    with pytest.raises(ConfigurationError, match="devices=2"):
        s.configure([torch.device("cpu")] * 2, 1, None)


class _Recording(SingleDeviceStrategy):
    """Records the stage-end calls a sharded strategy relies on."""

    def __init__(self) -> None:
        super().__init__(device="cpu")
        self.calls: list[str] = []

    def on_exception(self, exception: BaseException) -> None:
        self.calls.append(f"on_exception({type(exception).__name__})")

    def teardown(self) -> None:
        self.calls.append("teardown")
        super().teardown()


def test_a_stage_that_raises_tells_the_strategy_before_its_teardown():
    from torch.utils.data import DataLoader

    import torchfleet as tf
    from torchfleet.callbacks import Callback
    from torchfleet.demos import BoringModel, RandomDataset

    class Stop(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx == 1:
                raise KeyError("stop")

    strategy = _Recording()
    trainer = tf.Trainer(strategy=strategy, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[Stop()])
    with pytest.raises(KeyError, match="stop"):
        trainer.fit(BoringModel(), DataLoader(RandomDataset(32, 8), batch_size=2))
    assert strategy.calls == ["on_exception(KeyError)", "teardown"]
    strategy.calls.clear()
    trainer.validate(BoringModel(), DataLoader(RandomDataset(32, 4), batch_size=2), verbose=False)
    assert strategy.calls == ["teardown"]
