"""Fleet: custom loops over the same strategies; identical to plain PyTorch on one device."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers import loader, make_data
from torchfleet import Fleet, Trainer
from torchfleet.errors import CheckpointError, ConfigurationError
from torchfleet.strategies import SingleDeviceStrategy


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _plain_loop(model, steps=20):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = list(loader())
    for i in range(steps):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def _fleet_loop(fleet, model, steps=20):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = fleet.setup(model, opt)
    batches = list(fleet.setup_dataloaders(loader()))
    for i in range(steps):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        fleet.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
    return model, opt


def test_fleet_loop_is_bitwise_the_plain_loop():
    reference = _plain_loop(_mlp())
    model, _ = _fleet_loop(Fleet(accelerator="cpu", devices=1), _mlp())
    for a, b in zip(reference.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_bf16_autocast_is_active_in_the_wrapped_forward():
    fleet = Fleet(precision="bf16-mixed")
    model = fleet.setup(nn.Linear(4, 4))
    assert model(torch.randn(2, 4)).dtype == torch.bfloat16
    assert model.module.weight.dtype == torch.float32
    with fleet.autocast():
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16


def test_save_load_round_trip(tmp_path):
    fleet = Fleet()
    model, opt = _fleet_loop(fleet, _mlp(), steps=5)
    fleet.save(tmp_path / "state.ckpt", {"model": model, "optimizer": opt, "step": 5, "note": "hi"})
    fleet2 = Fleet()
    model2 = _mlp(seed=1)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.05, momentum=0.9)
    model2, opt2 = fleet2.setup(model2, opt2)
    state = {"model": model2, "optimizer": opt2, "step": 0}
    rest = fleet2.load(tmp_path / "state.ckpt", state)
    assert state["step"] == 5 and rest == {"note": "hi"}
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], opt2.state_dict()["state"][0]["momentum_buffer"])
    with pytest.raises(CheckpointError, match="does not exist"):
        fleet2.load(tmp_path / "missing.ckpt", state)


def test_collectives_on_one_device():
    fleet = Fleet()
    t = torch.arange(4.0)
    assert fleet.all_gather(t).shape == (1, 4)
    assert torch.equal(fleet.all_reduce(t), t)
    assert fleet.all_gather({"a": t})["a"].shape == (1, 4)
    assert fleet.broadcast(3) == 3
    fleet.barrier()
    assert fleet.world_size == 1 and fleet.global_rank == 0 and fleet.is_global_zero
    assert fleet.device == torch.device("cpu")


def test_setup_dataloaders_moves_batches_and_keeps_length():
    fleet = Fleet()
    dl = fleet.setup_dataloaders(loader(32))
    assert len(dl) == 4
    x, y = next(iter(dl))
    assert x.device == fleet.device


def test_clip_gradients():
    fleet = Fleet()
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = fleet.setup(model, opt)
    x, y = make_data(16).tensors
    fleet.backward(nn.functional.mse_loss(model(x), y) * 100)
    norm = fleet.clip_gradients(model, opt, max_norm=0.5)
    assert norm > 0.5
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert total == pytest.approx(0.5, rel=1e-4)
    fleet.clip_gradients(model, opt, clip_val=0.01)
    assert max(p.grad.abs().max() for p in model.parameters()) <= 0.01 + 1e-9
    with pytest.raises(ConfigurationError, match="exactly one"):
        fleet.clip_gradients(model, opt)
    with pytest.raises(ConfigurationError, match="exactly one"):
        fleet.clip_gradients(model, opt, clip_val=1, max_norm=1)


def test_bad_setup_calls():
    fleet = Fleet()
    with pytest.raises(ConfigurationError, match="before fleet.setup"):
        fleet.backward(torch.ones(1, requires_grad=True).sum())
    model = _mlp()
    other = _mlp(seed=2)
    with pytest.raises(ConfigurationError, match="not in the Sequential"):
        fleet.setup(model, torch.optim.SGD(other.parameters(), lr=0.1))
    wrapped = fleet.setup(model)
    with pytest.raises(ConfigurationError, match="already called"):
        fleet.setup(wrapped)
    with pytest.raises(ConfigurationError, match="already called"):
        fleet.setup(model)


def test_launch_runs_function_in_this_process():
    fleet = Fleet()
    assert fleet.launch(lambda f, a, b=0: (f.global_rank, a + b), 2, b=3) == (0, 5)


def test_init_module_uses_device_and_param_dtype():
    fleet = Fleet(precision="64-true")
    with fleet.init_module():
        layer = nn.Linear(2, 2)
    assert layer.weight.dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32


def test_fleet_and_trainer_take_the_same_strategy_kinds():
    for strategy in ("single_device", SingleDeviceStrategy()):
        assert isinstance(Fleet(strategy=strategy).strategy, SingleDeviceStrategy)
    for strategy in ("single_device", SingleDeviceStrategy()):
        assert isinstance(Trainer(strategy=strategy, logger=False).strategy, SingleDeviceStrategy)


def test_state_dict_passes_through_the_wrapper():
    fleet = Fleet()
    model = _mlp()
    wrapped = fleet.setup(model)
    assert wrapped.state_dict().keys() == model.state_dict().keys()
    assert wrapped.module is model
    model.custom_attribute = 7
    assert wrapped.custom_attribute == 7  # attribute access reaches the original module
