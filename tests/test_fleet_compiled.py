"""torch.compile'd models on one device: Fleet and the Trainer train the module inside under its own names.

Compiled with a counting backend that runs dynamo's captured graph as it is (like ``backend="eager"``):
inductor would need minutes of C++ compilation here; what is checked is that the compiled path is the
one that runs, and the names. ddp and fsdp: tests/distributed/test_fleet_compiled.py.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.helpers import loader, quiet
from torchfleet import Fleet, Module, Trainer
from torchfleet.checkpoint.state import load_state_dict_checked


class Graphs:
    def __init__(self) -> None:
        self.captured = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        self.captured += 1
        return gm.forward


class Net(Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x):
        return self.body(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_fleet_trains_a_compiled_module_as_the_plain_one_under_its_names(tmp_path):
    data = [(torch.randn(8, 8), torch.randn(8, 1)) for _ in range(4)]
    plain = Net()
    popt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for x, y in data:
        popt.zero_grad()
        nn.functional.mse_loss(plain(x), y).backward()
        popt.step()

    graphs = Graphs()
    fleet = Fleet(accelerator="cpu", devices=1)
    net = Net()
    model, opt = fleet.setup(torch.compile(net, backend=graphs), torch.optim.SGD(net.parameters(), lr=0.1))
    assert graphs.captured == 0
    for x, y in data:
        opt.zero_grad()
        fleet.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
    assert graphs.captured >= 1  # the calls ran the compiled wrapper
    assert list(model.state_dict()) == list(plain.state_dict())
    for k, v in plain.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    fleet.save(tmp_path / "m.ckpt", {"model": model})
    assert list(torch.load(tmp_path / "m.ckpt")["model"]) == list(plain.state_dict())


def test_fleet_setup_refuses_a_compiled_module_set_up_before():
    import pytest

    from torchfleet.errors import ConfigurationError

    fleet = Fleet(accelerator="cpu", devices=1)
    net = nn.Linear(2, 1)
    fleet.setup(net)
    with pytest.raises(ConfigurationError, match="already called"):
        fleet.setup(torch.compile(net, backend="eager"))


def test_weights_saved_from_a_compiled_module_load_into_the_plain_one():
    source = Net()
    saved = torch.compile(source, backend="eager").state_dict()
    assert all(k.startswith("_orig_mod.") for k in saved)
    target = Net()
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    load_state_dict_checked(target, saved)
    for k, v in source.state_dict().items():
        assert torch.equal(target.state_dict()[k], v), k

    # a model whose submodule is compiled keeps `_orig_mod.` in its own names: nothing is stripped
    holder = nn.Module()
    holder.inner = torch.compile(nn.Linear(2, 1), backend="eager")
    load_state_dict_checked(holder, dict(holder.state_dict()))
    assert list(holder.state_dict()) == ["inner._orig_mod.weight", "inner._orig_mod.bias"]


def test_trainer_fits_a_compiled_module_and_checkpoints_its_names(tmp_path):
    graphs = Graphs()
    module = Net()
    compiled = torch.compile(module, backend=graphs)
    trainer = Trainer(**quiet(max_epochs=1, default_root_dir=str(tmp_path), enable_checkpointing=True))
    trainer.fit(compiled, loader(n=32, batch_size=8))
    assert graphs.captured >= 1
    assert trainer.module is module  # the module inside is what was trained
    saved = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)["state_dict"]
    assert list(saved) == list(Net().state_dict())
    # fitting again compiles nothing twice: the methods were compiled once, in place
    forward = module.forward
    trainer2 = Trainer(**quiet(max_epochs=1, default_root_dir=str(tmp_path / "again")))
    trainer2.fit(compiled, loader(n=32, batch_size=8))
    assert module.forward is forward
