"""Fleet: custom loops over the same strategies; identical to plain PyTorch on one device."""

from __future__ import annotations

import copy
import csv
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from tests.helpers import EpochSampler, loader, make_data
from torchfleet import Fleet, Module, Trainer
from torchfleet.errors import CheckpointError, ConfigurationError
from torchfleet.fleet import FleetDataLoader, FleetModule, FleetOptimizer
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


def _steps(fleet, model, opt, start, stop):
    batches = list(fleet.setup_dataloaders(loader(shuffle=False)))
    for i in range(start, stop):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        fleet.backward(nn.functional.mse_loss(model(x), y))
        opt.step()


class Recording(SingleDeviceStrategy):
    """A real single-device strategy that notes which of its methods Fleet went through."""

    def __init__(self, launcher=None, **kwargs):
        super().__init__(**{"device": "cpu", **kwargs})
        self.calls: list[str] = []
        self._launcher = launcher

    def setup_environment(self):
        self.calls.append("setup_environment")
        super().setup_environment()

    def forward_context(self):
        self.calls.append("forward_context")
        return super().forward_context()

    def run_backward(self, tensor, module, *args, **kwargs):  # Fabric's backward(tensor, module), under its name here
        self.calls.append("backward")
        super().run_backward(tensor, module, *args, **kwargs)

    def optimizer_step(self, optimizer, closure=None, **kwargs):
        self.calls.append("optimizer_step")
        return super().optimizer_step(optimizer, closure, **kwargs)

    def all_gather(self, tensor, sync_grads=False):
        self.calls.append("all_gather")
        return super().all_gather(tensor, sync_grads)


class InlineLauncher:
    """A launcher that runs the function in this process, recording what it was given."""

    runs_in_children = False

    def __init__(self):
        self.launched = []

    def launch(self, function, *args, **kwargs):
        self.launched.append((args, kwargs))
        return function(*args, **kwargs)


# ---------------------------------------------------------------- training


def test_fleet_loop_is_bitwise_the_plain_loop():
    reference = _plain_loop(_mlp())
    model, _ = _fleet_loop(Fleet(accelerator="cpu", devices=1), _mlp())
    for a, b in zip(reference.parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert not torch.equal(reference[0].weight, _mlp()[0].weight)  # training did move the weights


def test_forward_backward_and_step_go_through_the_strategy():
    strategy = Recording()
    fleet = Fleet(strategy=strategy)
    model = nn.Linear(8, 1)
    model, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    strategy.calls.clear()
    x, y = make_data(8).tensors
    fleet.backward(nn.functional.mse_loss(model(x), y))
    opt.step()
    assert strategy.calls == ["forward_context", "backward", "optimizer_step"]


def test_bf16_autocast_is_active_in_the_wrapped_forward():
    seen = {}

    class Probe(nn.Linear):
        def forward(self, x):
            seen["enabled"] = torch.is_autocast_enabled("cpu")
            seen["dtype"] = torch.get_autocast_dtype("cpu")
            return super().forward(x)

    fleet = Fleet(accelerator="cpu", precision="bf16-mixed")
    model = fleet.setup(Probe(4, 4))
    out = model(torch.randn(2, 4))
    assert seen == {"enabled": True, "dtype": torch.bfloat16}
    assert out.dtype == torch.bfloat16
    assert model.module.weight.dtype == torch.float32  # mixed: parameters stay float32
    assert not torch.is_autocast_enabled("cpu")  # only inside the forward
    model.module(torch.randn(2, 4))  # the plain module runs without autocast
    assert seen["enabled"] is False
    with fleet.autocast():
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16


def test_16_mixed_scales_the_loss_and_the_step_unscales():
    fleet = Fleet(accelerator="cpu", precision="16-mixed")
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    before = model.weight.detach().clone()
    model, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    fleet.backward(model(torch.randn(8, 4)).float().mean() * 0.1)  # no fp16 overflow at scale 2**16
    scale = fleet.strategy.precision.scaler.get_scale()
    assert scale > 1
    scaled_grad = model.weight.grad.clone()
    opt.step()
    # a plain optimizer.step() on scaled gradients would move the weights `scale` times too far
    assert torch.allclose(model.weight, before - 0.1 * scaled_grad / scale)
    assert not torch.equal(model.weight, before)


def test_16_mixed_clip_gradients_lets_the_scaler_skip_an_overflowing_step():
    fleet = Fleet(accelerator="cpu", precision="16-mixed")
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    before = model.weight.detach().clone()
    model, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    scaler = fleet.strategy.precision.scaler
    scale = scaler.get_scale()
    # times the loss scale (2**16) this exceeds float32's range: every gradient is inf
    fleet.backward(model(torch.randn(8, 4)).float().mean() * 1e36)
    norm = fleet.clip_gradients(model, opt, max_norm=1.0)  # error_if_nonfinite defaults to True
    assert not torch.isfinite(norm)
    opt.step()
    assert torch.equal(model.weight, before)  # the step was skipped
    assert scaler.get_scale() == scale * scaler.get_backoff_factor()
    # the next, finite step goes through: clipping then bounds it
    opt.zero_grad()
    fleet.backward(model(torch.randn(8, 4)).float().mean())
    assert torch.isfinite(fleet.clip_gradients(model, opt, max_norm=1e-3))
    opt.step()
    assert not torch.equal(model.weight, before)
    assert (model.weight - before).norm() <= 0.1 * 1e-3 * 1.0001


def test_clip_gradients_without_a_scaler_still_refuses_a_nonfinite_norm():
    fleet = Fleet(accelerator="cpu")
    model = nn.Linear(4, 1)
    model, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    fleet.backward(model(torch.randn(8, 4)).mean() * float("inf"))
    with pytest.raises(RuntimeError, match="non-finite"):
        fleet.clip_gradients(model, opt, max_norm=1.0)


def test_lr_scheduler_accepts_the_set_up_optimizer():
    fleet = Fleet(accelerator="cpu")
    model = _mlp()
    model, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=1.0))
    assert isinstance(opt, torch.optim.SGD) and isinstance(opt, FleetOptimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = make_data(8).tensors
    fleet.backward(nn.functional.mse_loss(model(x), y))
    opt.step()
    scheduler.step()
    assert opt.optimizer.param_groups[0]["lr"] == 0.5  # the scheduler changed the real optimizer
    assert opt.param_groups is opt.optimizer.param_groups


def test_clip_gradients():
    fleet = Fleet(accelerator="cpu")
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = fleet.setup(model, opt)
    x, y = make_data(16).tensors
    fleet.backward(nn.functional.mse_loss(model(x), y) * 100)
    norm = fleet.clip_gradients(model, opt, max_norm=0.5)
    assert norm > 0.5
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert total == pytest.approx(0.5, rel=1e-4)
    assert fleet.clip_gradients(model, opt, clip_val=0.01) is None
    assert max(p.grad.abs().max() for p in model.parameters()) <= 0.01 + 1e-9
    with pytest.raises(ConfigurationError, match="exactly one"):
        fleet.clip_gradients(model, opt)
    with pytest.raises(ConfigurationError, match="exactly one"):
        fleet.clip_gradients(model, opt, clip_val=1, max_norm=1)


def test_backward_with_two_models_takes_model_argument():
    fleet = Fleet(accelerator="cpu")
    a, b = fleet.setup(nn.Linear(2, 1)), fleet.setup(nn.Linear(2, 1))
    x = torch.randn(4, 2)
    fleet.backward((a(x) + b(x)).sum(), model=a)
    assert a.module.weight.grad is not None and b.module.weight.grad is not None
    loss = a(x).sum()
    fleet.backward(loss, retain_graph=True)  # extra arguments reach Tensor.backward
    fleet.backward(loss)


def test_no_backward_sync_on_one_device_accumulates():
    fleet = Fleet(accelerator="cpu")
    model = fleet.setup(nn.Linear(2, 1))
    x = torch.ones(1, 2)
    with fleet.no_backward_sync(model):
        fleet.backward(model(x).sum())
    fleet.backward(model(x).sum())
    assert torch.equal(model.module.weight.grad, 2 * x)
    with pytest.raises(ConfigurationError, match="did not return"):
        fleet.no_backward_sync(nn.Linear(2, 1))


# --------------------------------------------------------------- checkpoints


def test_save_load_round_trip(tmp_path):
    fleet = Fleet(accelerator="cpu")
    model, opt = _fleet_loop(fleet, _mlp(), steps=5)
    fleet.save(tmp_path / "state.ckpt", {"model": model, "optimizer": opt, "step": 5, "note": "hi"})
    fleet2 = Fleet(accelerator="cpu")
    model2 = _mlp(seed=1)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.05, momentum=0.9)
    model2, opt2 = fleet2.setup(model2, opt2)
    state = {"model": model2, "optimizer": opt2, "step": 0}
    rest = fleet2.load(tmp_path / "state.ckpt", state)
    assert state["step"] == 5 and rest == {"note": "hi"}
    assert state["model"] is model2 and state["optimizer"] is opt2  # objects are loaded in place, not replaced
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], opt2.state_dict()["state"][0]["momentum_buffer"])
    with pytest.raises(CheckpointError, match="does not exist"):
        fleet2.load(tmp_path / "missing.ckpt", state)
    assert fleet2.load(tmp_path / "state.ckpt")["step"] == 5  # no state: the whole checkpoint comes back


def test_resume_gives_the_weights_of_an_uninterrupted_run(tmp_path):
    def build(fleet, seed):
        model = _mlp(seed)
        return fleet.setup(model, torch.optim.Adam(model.parameters(), lr=0.01))

    fleet = Fleet(accelerator="cpu")
    straight, straight_opt = build(fleet, 0)
    _steps(fleet, straight, straight_opt, 0, 10)

    fleet = Fleet(accelerator="cpu")
    first, first_opt = build(fleet, 0)
    _steps(fleet, first, first_opt, 0, 5)
    fleet.save(tmp_path / "half.ckpt", {"model": first, "optimizer": first_opt, "step": 5})

    fleet = Fleet(accelerator="cpu")
    resumed, resumed_opt = build(fleet, 3)
    state = {"model": resumed, "optimizer": resumed_opt, "step": 0}
    fleet.load(tmp_path / "half.ckpt", state)
    _steps(fleet, resumed, resumed_opt, state["step"], 10)

    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    s1, s2 = straight_opt.state_dict()["state"], resumed_opt.state_dict()["state"]
    assert s1.keys() == s2.keys()
    for k in s1:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(s1[k][name], s2[k][name])


def test_save_load_a_list_of_set_up_optimizers(tmp_path):
    fleet = Fleet(accelerator="cpu")
    model = _mlp()
    model, o1, o2 = fleet.setup(model, torch.optim.SGD(model[0].parameters(), lr=0.1, momentum=0.9),
                                torch.optim.Adam(model[2].parameters(), lr=0.1))
    fleet.backward(model(torch.randn(4, 8)).sum())
    o1.step()
    o2.step()
    fleet.save(tmp_path / "c.ckpt", {"opts": [o1, o2]})
    saved = torch.load(tmp_path / "c.ckpt", weights_only=False)
    assert [type(o) for o in saved["opts"]] == [dict, dict]  # state dicts, not pickled wrapper objects
    model_b = _mlp(seed=5)
    p1 = torch.optim.SGD(model_b[0].parameters(), lr=0.1, momentum=0.9)
    p2 = torch.optim.Adam(model_b[2].parameters(), lr=0.1)
    model_b, p1, p2 = fleet.setup(model_b, p1, p2)
    state = {"opts": [p1, p2]}
    fleet.load(tmp_path / "c.ckpt", state)
    assert state["opts"][0] is p1  # loaded in place, not replaced by state dicts
    assert torch.equal(p1.state_dict()["state"][0]["momentum_buffer"], o1.state_dict()["state"][0]["momentum_buffer"])
    assert torch.equal(p2.state_dict()["state"][0]["exp_avg"], o2.state_dict()["state"][0]["exp_avg"])


def test_load_strict_requires_every_requested_key(tmp_path):
    fleet = Fleet(accelerator="cpu")
    fleet.save(tmp_path / "c.ckpt", {"step": 3})
    state = {"step": 0, "epoch": 7}
    with pytest.raises(CheckpointError, match="'epoch'"):
        fleet.load(tmp_path / "c.ckpt", state)
    assert fleet.load(tmp_path / "c.ckpt", state, strict=False) == {}
    assert state == {"step": 3, "epoch": 7}
    with pytest.raises(ConfigurationError, match="dict"):
        fleet.save(tmp_path / "d.ckpt", [1, 2])


# ------------------------------------------------------------- collectives


def test_collectives_on_one_device():
    fleet = Fleet(accelerator="cpu")
    t = torch.arange(4.0)
    assert fleet.all_gather(t).shape == (1, 4)
    assert torch.equal(fleet.all_gather(t)[0], t)
    assert torch.equal(fleet.all_reduce(t), t)
    assert torch.equal(fleet.all_reduce(t, reduce_op="sum"), t)
    assert float(fleet.all_reduce(2.5)) == 2.5
    nested = fleet.all_gather({"a": t, "b": [t[:2], (t[:3],)]})
    assert nested["a"].shape == (1, 4) and nested["b"][0].shape == (1, 2) and nested["b"][1][0].shape == (1, 3)
    assert fleet.broadcast({"x": 3}) == {"x": 3}
    fleet.barrier()
    fleet.barrier("named")
    assert fleet.world_size == 1 and fleet.global_rank == 0 and fleet.is_global_zero
    assert fleet.local_rank == 0 and fleet.node_rank == 0
    assert fleet.device == torch.device("cpu")
    with pytest.raises(ConfigurationError, match="reduce operation"):
        fleet.all_reduce(t, reduce_op="median")


def test_torchfleet_module_collectives_use_the_fleet_strategy():
    class Net(Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(2, 2)

    strategy = Recording()
    fleet = Fleet(strategy=strategy)
    net = Net()
    fleet.setup(net)
    assert net._fleet is fleet
    assert net.all_gather(torch.ones(3)).shape == (1, 3)
    assert "all_gather" in strategy.calls


# -------------------------------------------------------------- dataloaders


def test_setup_dataloaders_moves_batches_to_the_device_and_keeps_length():
    fleet = Fleet(strategy=SingleDeviceStrategy(device="meta"))
    dl = fleet.setup_dataloaders(loader(32))
    assert isinstance(dl, FleetDataLoader) and len(dl) == 4
    x, y = next(iter(dl))
    assert x.is_meta and y.is_meta  # a real move, to the strategy's device
    raw = fleet.setup_dataloaders(loader(32), move_to_device=False)
    assert not next(iter(raw))[0].is_meta
    a, b = fleet.setup_dataloaders(loader(16), loader(24))
    assert (len(a), len(b)) == (2, 3)


def test_setup_dataloaders_applies_the_precision_to_batches():
    fleet = Fleet(accelerator="cpu", precision="64-true")
    x, y = next(iter(fleet.setup_dataloaders(loader(16))))
    assert x.dtype == torch.float64 and y.dtype == torch.float64


def test_set_epoch_reaches_the_sampler():
    data = make_data(16)
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    dl = Fleet(accelerator="cpu").setup_dataloaders(DataLoader(data, sampler=sampler, batch_size=4))
    dl.set_epoch(3)
    assert sampler.epoch == 3
    assert dl.batch_size == 4  # other attributes come from the dataloader
    list(dl)  # set_epoch(3) chose the pass it makes: still epoch 3, and the passes after count on from there
    assert sampler.epoch == 3
    list(dl)
    assert sampler.epoch == 4


def test_each_pass_over_a_set_up_loader_is_the_next_epoch():
    """As Fabric counts: the sampler and a batch sampler's sampler hear 0, 1, 2 at the passes' starts, and an
    epoch a loop sets on the sampler itself is overridden by the count."""
    data = make_data(8)
    plain, inner = EpochSampler(8), EpochSampler(8)
    fleet = Fleet(accelerator="cpu")
    a, b = fleet.setup_dataloaders(DataLoader(data, sampler=plain, batch_size=4),
                                   DataLoader(data, batch_sampler=torch.utils.data.BatchSampler(inner, 4, False)))
    for epoch in range(3):
        plain.set_epoch(10 + epoch)  # what a loop written without Fabric's counting might do
        assert len(list(a)) == len(list(b)) == 2
    assert plain.epochs == [10, 0, 11, 1, 12, 2] and inner.epochs == [0, 1, 2]


# ------------------------------------------------------------ setup & errors


def test_bad_setup_calls():
    fleet = Fleet(accelerator="cpu")
    with pytest.raises(ConfigurationError, match="before fleet.setup"):
        fleet.backward(torch.ones(1, requires_grad=True).sum())
    model = _mlp()
    other = _mlp(seed=2)
    with pytest.raises(ConfigurationError, match=r"optimizer 0 \(SGD\).*not in the Sequential"):
        fleet.setup(model, torch.optim.SGD(other.parameters(), lr=0.1))
    with pytest.raises(ConfigurationError, match="nn.Module first"):
        fleet.setup(torch.optim.SGD(model.parameters(), lr=0.1))
    wrapped, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ConfigurationError, match="already called"):
        fleet.setup(wrapped)
    with pytest.raises(ConfigurationError, match="already called"):
        fleet.setup(model)
    with pytest.raises(ConfigurationError, match="already set up"):
        fleet.setup_optimizers(opt)
    with pytest.raises(ConfigurationError, match="no optimizer"):
        fleet.setup_optimizers()


def test_setup_return_shapes_and_separate_setup():
    fleet = Fleet(accelerator="cpu")
    m = _mlp()
    assert isinstance(fleet.setup(m), FleetModule)
    m2 = _mlp()
    out = fleet.setup(m2, torch.optim.SGD(m2[0].parameters(), lr=0.1), torch.optim.SGD(m2[2].parameters(), lr=0.1))
    assert len(out) == 3 and isinstance(out[0], FleetModule)
    assert all(isinstance(o, FleetOptimizer) for o in out[1:])
    m3 = fleet.setup_module(_mlp())
    o3 = fleet.setup_optimizers(torch.optim.SGD(m3.parameters(), lr=0.1))
    assert isinstance(o3, FleetOptimizer)
    assert len(fleet.setup_optimizers(torch.optim.SGD(m3.parameters(), lr=0.1),
                                      torch.optim.SGD(m3.parameters(), lr=0.1))) == 2


def test_launch_runs_function_in_this_process_after_setting_up_the_environment():
    strategy = Recording()
    fleet = Fleet(strategy=strategy)
    assert fleet.launch(lambda f, a, b=0: (f.global_rank, a + b, list(strategy.calls)), 2, b=3) == (
        0, 5, ["setup_environment"])
    fleet.setup(nn.Linear(2, 2))
    assert strategy.calls.count("setup_environment") == 1


def test_setup_prepares_the_environment_lazily_once():
    strategy = Recording()
    fleet = Fleet(strategy=strategy)
    assert strategy.calls == []
    fleet.setup(nn.Linear(2, 2))
    fleet.setup(nn.Linear(2, 2))
    assert strategy.calls.count("setup_environment") == 1


def test_launch_goes_through_the_strategy_launcher():
    launcher = InlineLauncher()
    strategy = Recording(launcher=launcher)
    fleet = Fleet(strategy=strategy)
    assert fleet.launch(lambda f, x: f.world_size + x, 41) == 42
    assert len(launcher.launched) == 1 and "setup_environment" in strategy.calls
    assert fleet.launch() is None and len(launcher.launched) == 2


def test_init_module_uses_device_and_param_dtype():
    fleet = Fleet(accelerator="cpu", precision="64-true")
    with fleet.init_module():
        layer = nn.Linear(2, 2)
    assert layer.weight.dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32
    with Fleet(accelerator="cpu", precision="bf16-true").init_module():
        assert nn.Linear(2, 2).weight.dtype == torch.bfloat16
    with Fleet(accelerator="cpu", precision="bf16-mixed").init_module():
        assert nn.Linear(2, 2).weight.dtype == torch.float32  # mixed keeps float32 parameters
    with Fleet(strategy=SingleDeviceStrategy(device="meta")).init_module(empty_init=True):
        assert nn.Linear(2, 2).weight.is_meta
    assert torch.get_default_dtype() == torch.float32
    with pytest.raises(RuntimeError), Fleet(accelerator="cpu", precision="64-true").init_module():
        raise RuntimeError("boom")
    assert torch.get_default_dtype() == torch.float32  # restored on errors too


def test_fleet_and_trainer_take_the_same_strategy_kinds():
    for strategy in ("single_device", SingleDeviceStrategy()):
        assert isinstance(Fleet(strategy=strategy).strategy, SingleDeviceStrategy)
    for strategy in ("single_device", SingleDeviceStrategy()):
        assert isinstance(Trainer(strategy=strategy, logger=False).strategy, SingleDeviceStrategy)
    given = SingleDeviceStrategy()
    assert Fleet(strategy=given).strategy is given
    with pytest.raises(ConfigurationError, match="single_device"):
        Fleet(strategy="single_devise")


def test_wrapper_passes_state_dict_and_attributes_through():
    fleet = Fleet(accelerator="cpu")
    model = _mlp()
    wrapped = fleet.setup(model)
    assert wrapped.state_dict().keys() == model.state_dict().keys()
    assert wrapped.module is model
    model.custom_attribute = 7
    assert wrapped.custom_attribute == 7  # reads reach the original module
    wrapped.flag = "on"
    assert model.flag == "on"  # writes too, so the module's forward sees them
    wrapped.eval()
    assert not wrapped.training and not model.training
    zeros = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    wrapped.load_state_dict(zeros)
    assert all(torch.count_nonzero(p) == 0 for p in model.parameters())
    assert [id(p) for p in wrapped.parameters()] == [id(p) for p in model.parameters()]


def test_optimizer_wrapper_delegates():
    fleet = Fleet(accelerator="cpu")
    model = _mlp()
    raw = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = fleet.setup(model, raw)
    assert opt.optimizer is raw and opt.defaults is raw.defaults and opt.state is raw.state
    opt.param_groups[0]["lr"] = 0.2
    assert raw.param_groups[0]["lr"] == 0.2
    fleet.backward(model(torch.randn(2, 8)).sum())
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert opt.state_dict()["param_groups"][0]["lr"] == 0.2
    twin = copy.deepcopy(opt)
    assert isinstance(twin, FleetOptimizer) and twin.optimizer is not raw and twin.param_groups[0]["lr"] == 0.2
    model_twin = copy.deepcopy(model)
    assert isinstance(model_twin, FleetModule) and model_twin.module is not model.module
    assert torch.equal(model_twin(torch.ones(1, 8)), model(torch.ones(1, 8)))


# ---------------------------------------------------------------- misc


def test_print_log_call_and_seed(capsys):
    class Sink:
        def __init__(self):
            self.rows = []

        def log_metrics(self, metrics, step=None):
            self.rows.append((metrics, step))

    class Hooks:
        def __init__(self):
            self.seen = []

        def on_epoch(self, fleet, epoch):
            self.seen.append(epoch)

    sink, hooks = Sink(), Hooks()
    fleet = Fleet(loggers=sink, callbacks=[hooks, object()])
    assert fleet.logger is sink and fleet.loggers == [sink]
    fleet.log("loss", torch.tensor(0.5), step=3)
    fleet.log_dict({"a": 1, "b": torch.tensor(2.0)})
    assert sink.rows == [({"loss": 0.5}, 3), ({"a": 1.0, "b": 2.0}, None)]
    fleet.call("on_epoch", fleet, 4)
    fleet.call("no_such_hook")
    assert hooks.seen == [4]
    fleet.print("hello", 1)
    assert capsys.readouterr().out == "hello 1\n"
    assert fleet.seed_everything(123) == 123
    a = torch.rand(3)
    fleet.seed_everything(123)
    assert torch.equal(a, torch.rand(3))
    assert Fleet(accelerator="cpu").logger is None


def test_to_device():
    fleet = Fleet(strategy=SingleDeviceStrategy(device="meta"))
    moved = fleet.to_device({"x": torch.ones(2), "y": [torch.zeros(1)]})
    assert moved["x"].is_meta and moved["y"][0].is_meta
    assert fleet.to_device(nn.Linear(2, 2)).weight.is_meta


class _WithLossMethod(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)

    def forward(self, x):
        return self.net(x)

    def loss_step(self, x, y):
        return nn.functional.mse_loss(self.net(x), y)


def test_one_device_calls_any_method_directly_marked_or_not():
    fleet = Fleet(accelerator="cpu", devices=1)
    model = fleet.setup(_WithLossMethod())
    original = model.module
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    # nothing to route on one device: the bound method itself, no wrapper per call, before and after marking
    assert model.loss_step == original.loss_step and model.net is original.net
    model.mark_forward_method("loss_step")
    model.mark_forward_method(model.loss_step)
    assert model.loss_step == original.loss_step
    assert torch.equal(model.loss_step(x, y), nn.functional.mse_loss(original.net(x), y))
    assert torch.equal(model.net(x), original.net(x))


def test_mark_forward_method_refuses_what_is_not_a_method_of_the_module():
    model = Fleet(accelerator="cpu", devices=1).setup(_WithLossMethod())
    with pytest.raises(ConfigurationError, match=r"has no method 'los_step'"):
        model.mark_forward_method("los_step")
    with pytest.raises(ConfigurationError, match=r"has no method 'parameters'"):
        model.mark_forward_method("parameters")  # nn.Module's own: computes nothing
    with pytest.raises(ConfigurationError, match=r"model\(\.\.\.\)\) runs forward"):
        model.mark_forward_method("forward")
    with pytest.raises(ConfigurationError, match=r"takes the name of a method"):
        model.mark_forward_method(_WithLossMethod().loss_step)  # another instance's method
    with pytest.raises(ConfigurationError, match=r"takes the name of a method"):
        model.mark_forward_method(3)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_setup_before_launch_is_refused_at_once(monkeypatch, strategy):
    for var in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)  # not a process some launcher started
    fleet = Fleet(strategy=strategy, accelerator="cpu", devices=2)
    # without the check, setup() waits in init_process_group for a rank 1 that nobody starts
    with pytest.raises(ConfigurationError, match=r"before fleet\.launch\(\).*runs 2 processes.*torchfleet run"):
        fleet.setup(nn.Linear(2, 1))
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_rank_zero_first_on_one_process_runs_the_block_once():
    fleet = Fleet(accelerator="cpu", devices=1)
    ran = []
    with fleet.rank_zero_first():
        ran.append(fleet.global_rank)
    with fleet.rank_zero_first(local=True):
        ran.append(fleet.local_rank)
    assert ran == [0, 0]


def test_module_logger_and_self_log_reach_the_fleet_loggers(tmp_path):
    from torchfleet.loggers import CSVLogger

    class Logs(Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch).pow(2).mean()
            self.log("loss", loss)
            self.log("not_logged", 1.0, logger=False)
            return loss

    first, second = CSVLogger(str(tmp_path), name="a"), CSVLogger(str(tmp_path), name="b")
    fleet = Fleet(accelerator="cpu", devices=1, loggers=[first, second])
    module = Logs()
    assert module.logger is None and module.loggers == []  # set up by no Trainer or Fleet yet
    model = fleet.setup(module)
    assert module.logger is first and module.loggers == [first, second]
    assert model.logger is first  # through the set-up module too
    loss = model.training_step(torch.ones(3, 2), 0)
    fleet.log("step_value", 2.0, step=5)
    for lg in (first, second):
        lg.save()
        with open(os.path.join(lg.log_dir, "metrics.csv")) as f:
            rows = list(csv.DictReader(f))
        assert float(rows[0]["loss"]) == pytest.approx(loss.item())
        assert "not_logged" not in rows[0]
        assert [float(r["step_value"]) for r in rows if r.get("step_value")] == [2.0]


def test_values_logged_through_fleet_reach_the_file_when_the_script_ends(tmp_path):
    """A Fleet loop has no end the Fleet sees; CSVLogger buffers 100 steps, so rows are written at exit."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        from torchfleet import Fleet
        from torchfleet.loggers import CSVLogger
        fleet = Fleet(accelerator="cpu", devices=1, loggers=CSVLogger(root_dir={str(tmp_path)!r}))
        for step in range(3):
            fleet.log("loss", 1.0 / (step + 1), step=step)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "logs" / "version_0" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["step"]), float(r["loss"])) for r in rows] == [(0, 1.0), (1, 0.5), (2, 1.0 / 3)]
