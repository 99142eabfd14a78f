"""Third-party strategies ported by changing imports: our own small ones, shaped as lightning-hivemind's and
lightning-colossalai's subclass Lightning's Strategy, run unchanged under torchfleet's Trainer.

``CollaborativeStrategy`` has HivemindStrategy's shape: a SingleDeviceStrategy whose ``setup(trainer)`` calls
``super().setup(trainer)`` and then swaps the optimizer for its own wrapper (hivemind.Optimizer there; here one
that counts the steps it takes), a peer-to-peer resource it starts in ``setup`` and must release in
``teardown`` (the DHT there; without it a hivemind peer's process never exits), its own ``on_train_batch_start``
and identity collectives. ``ShardedEngineStrategy`` has ColossalAIStrategy's shape: ``backward`` goes through its
optimizer wrapper (``optimizer.backward(loss)``), ``optimizer_step`` calls the closure itself and then steps,
``model_sharded_context`` is where the model's layers are built, ``lightning_module_state_dict`` saves through it.
Both must train exactly as the plain one-device strategy does.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch import nn

import torchfleet as tf
from tests.helpers import Regressor, loader, quiet
from torchfleet.strategies import SingleDeviceStrategy


class _Peer:
    """Stands in for hivemind's DHT: started in setup, its thread must be shut down in teardown."""

    alive: list[_Peer] = []

    def __init__(self) -> None:
        _Peer.alive.append(self)

    def shutdown(self) -> None:
        _Peer.alive.remove(self)


class _CountingOptimizer(torch.optim.Optimizer):
    """hivemind.Optimizer's place: wraps the user's optimizer, steps it (it would average with the peers first)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.__dict__.update(optimizer=optimizer, steps=0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["optimizer"], name)

    def step(self, closure: Any = None) -> Any:
        self.steps += 1
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)


# --- the shape of lightning-hivemind's HivemindStrategy (imports changed) ---
class CollaborativeStrategy(SingleDeviceStrategy):
    def __init__(self, target_batch_size: int = 64) -> None:
        super().__init__(device="cpu")
        self.target_batch_size = target_batch_size
        self.dht: _Peer | None = None
        self.batches_seen = 0

    def setup(self, trainer: Any) -> None:
        self.model_to_device()
        super().setup(trainer)
        self.dht = _Peer()
        self.optimizers = [_CountingOptimizer(opt) for opt in self.optimizers]

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.batches_seen += 1

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        return tensor

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        pass

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def teardown(self) -> None:
        super().teardown()
        if self.dht is not None:
            self.dht.shutdown()
            self.dht = None
# --- end ---


class _EngineOptimizer(_CountingOptimizer):
    """ColossalAI's optimizer wrapper: the backward goes through it."""

    backwards = 0

    def backward(self, loss: torch.Tensor) -> None:
        _EngineOptimizer.backwards += 1
        loss.backward()


# --- the shape of lightning-colossalai's ColossalAIStrategy (imports changed) ---
class ShardedEngineStrategy(SingleDeviceStrategy):
    def __init__(self) -> None:
        super().__init__(device="cpu")
        self.closure_calls = 0
        self.built_in_context = False

    @contextlib.contextmanager
    def model_sharded_context(self):
        self.built_in_context = True
        yield

    def setup_precision_plugin(self) -> None:
        super().setup_precision_plugin()
        self.optimizers = [_EngineOptimizer(opt) for opt in self.optimizers]

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.pre_backward(closure_loss)
        optimizer.backward(closure_loss)
        self.post_backward(closure_loss)
        return closure_loss

    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        closure_result = closure()
        self.closure_calls += 1
        optimizer.step()
        return closure_result

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return {k: v.clone() for k, v in self.lightning_module.state_dict().items()}
# --- end ---


class Built(Regressor):
    """A Regressor whose layer is built in configure_model (where ColossalAI shards it)."""

    def __init__(self) -> None:
        super().__init__()
        self.configured = 0

    def configure_model(self) -> None:
        self.configured += 1


def _fit(strategy: Any, tmp_path, steps: int = 6) -> tuple[tf.Module, tf.Trainer]:
    torch.manual_seed(0)
    model = Built()
    trainer = tf.Trainer(**quiet(strategy=strategy, max_steps=steps, default_root_dir=tmp_path,
                                 enable_checkpointing=False))
    trainer.fit(model, loader(32))
    return model, trainer


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_hivemind_shaped_strategy_trains_as_one_device_and_releases_its_peer(tmp_path):
    plain, _ = _fit(SingleDeviceStrategy(device="cpu"), tmp_path / "plain")
    strategy = CollaborativeStrategy()
    model, trainer = _fit(strategy, tmp_path / "peer")
    assert _same(model, plain)
    assert trainer.optimizers[0].steps == trainer.global_step == 6  # the Trainer stepped the strategy's optimizer
    assert strategy.batches_seen == 6
    assert strategy.dht is None and not _Peer.alive  # released by teardown, at the end of the stage


def test_a_hivemind_shaped_strategy_releases_its_peer_when_the_fit_fails(tmp_path):
    class Failing(Built):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                raise KeyError("peer lost")
            return super().training_step(batch, batch_idx)

    strategy = CollaborativeStrategy()
    trainer = tf.Trainer(**quiet(strategy=strategy, max_steps=6, default_root_dir=tmp_path, enable_checkpointing=False))
    with pytest.raises(KeyError, match="peer lost"):
        trainer.fit(Failing(), loader(32))
    assert strategy.dht is None and not _Peer.alive


def test_a_colossalai_shaped_strategy_runs_backward_and_the_closure_its_own_way(tmp_path):
    plain, _ = _fit(SingleDeviceStrategy(device="cpu"), tmp_path / "plain")
    _EngineOptimizer.backwards = 0
    strategy = ShardedEngineStrategy()
    model, trainer = _fit(strategy, tmp_path / "engine")
    assert _same(model, plain)
    assert strategy.closure_calls == _EngineOptimizer.backwards == trainer.global_step == 6
    assert strategy.built_in_context and model.configured == 1
    trainer.save_checkpoint(tmp_path / "c.ckpt")  # the checkpoint's state_dict comes from its own method
    saved = torch.load(tmp_path / "c.ckpt", weights_only=True)["state_dict"]
    assert saved.keys() == model.state_dict().keys()
