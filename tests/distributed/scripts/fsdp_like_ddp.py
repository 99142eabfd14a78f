"""What users write, run under ddp and then fsdp in the same 2 CPU processes; rank 0 saves what each gave.

    python fsdp_like_ddp.py '{"out": "results.pt"}'

The first Fleet (ddp) is launched with ``fleet.launch()``; the fsdp Fleet and the Trainers after it find the ranks
running and set up without a launch, as a program started by torchrun does. Per strategy:

- ``zero_grad``: three identical steps calling ``module.zero_grad()`` between forward and backward (Fleet, and a
  Module's ``self.zero_grad()`` inside ``training_step`` under the Trainer): the whole gradients' norms;
- ``distributions``: a policy whose head returns ``torch.distributions.Normal``, the head a unit of its own under
  fsdp (``auto_wrap_policy``), and the same with the root returning it: losses and weights;
- ``image``: a Fabric-style image classifier (conv net with dropout, Adadelta, StepLR, test loss all-gathered);
- ``kfold``: a k-fold loop resetting one set-up model per fold, by ``reset_parameters()`` and by ``load_state_dict``;
- under fsdp only, a module returning its tensor inside an object fully_shard cannot look into: the error.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import torchfleet as tf  # noqa: E402
from torchfleet.errors import ConfigurationError  # noqa: E402
from torchfleet.strategies import FSDPStrategy  # noqa: E402


def whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def grad_norm(model: nn.Module) -> float:
    return float(torch.sqrt(sum(whole(p.grad).pow(2).sum() for p in model.parameters() if p.grad is not None)))


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: whole(v).detach().clone() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------ zero_grad between forward and backward
def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def zero_grad_fleet(fleet: tf.Fleet) -> list[float]:
    fleet.seed_everything(0)
    model = mlp()
    model, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.0))  # lr 0: every step is the same
    x = torch.ones(4, 4) * (fleet.global_rank + 1)
    norms = []
    for _ in range(3):
        out = model(x)
        model.zero_grad()
        fleet.backward(out.pow(2).sum())
        norms.append(grad_norm(model))
        opt.step()
    return norms


class ZeroGradInStep(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()
        self.norms: list[float] = []

    def training_step(self, batch, batch_idx):
        out = self.net(batch[0])
        self.zero_grad()  # between this step's forward and its backward
        return out.pow(2).sum()

    def on_before_optimizer_step(self, optimizer):
        self.norms.append(grad_norm(self))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def zero_grad_trainer(strategy: str) -> list[float]:
    tf.seed_everything(0)
    model = ZeroGradInStep()
    data = TensorDataset(torch.ones(8, 4) * torch.arange(1, 9).unsqueeze(1))
    trainer = tf.Trainer(strategy=strategy, accelerator="cpu", devices=2, max_steps=3, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    # the same batch every step on each rank (a sampler reading index 0 and 1 over and over)
    trainer.fit(model, DataLoader(data, batch_size=1, sampler=[0, 1] * 3))
    return model.norms


# ------------------------------------------------------------------------------ a module returning a Distribution
class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mu, self.log_std = nn.Linear(8, 2), nn.Linear(8, 2)

    def forward(self, h):
        return torch.distributions.Normal(self.mu(h), self.log_std(h).exp())


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.head = Head()

    def forward(self, x):
        return self.head(self.body(x))


def distributions(fleet: tf.Fleet) -> dict:
    fleet.seed_everything(0)
    model = Policy()
    model, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    g = torch.Generator().manual_seed(fleet.global_rank)
    losses = []
    for _ in range(3):
        x, y = torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)
        loss = -model(x).log_prob(y).mean()
        opt.zero_grad()
        fleet.backward(loss)
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "weights": weights(model)}


class Boxed:
    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class ReturnsBoxed(nn.Module):
    """Returns its tensor inside an object fully_shard cannot look into."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)

    def forward(self, x):
        return Boxed(self.layer(x))


def opaque_output(fleet: tf.Fleet) -> str:
    model = fleet.setup(ReturnsBoxed())
    try:
        model(torch.ones(1, 2))
    except ConfigurationError as err:
        return str(err)
    return "no error"


# ------------------------------------------------------------------------------ Fabric-style image classifier, k-fold
class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 4, 3, 1), nn.Conv2d(4, 8, 3, 1)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(8 * 2 * 2, 16), nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = self.dropout2(F.relu(self.fc1(self.dropout1(torch.flatten(x, 1)))))
        return F.log_softmax(self.fc2(x), dim=1)


def images(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


def test_loss(fleet: tf.Fleet, model, loader, size: int) -> float:
    model.eval()
    total = torch.tensor(0.0)
    with torch.no_grad():
        for x, y in loader:
            total += F.nll_loss(model(x), y, reduction="sum")
    return float(fleet.all_gather(total).sum()) / size


def train_epoch(fleet: tf.Fleet, model, loader, optimizer) -> None:
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        fleet.backward(F.nll_loss(model(x), y))
        optimizer.step()


def image_classifier(fleet: tf.Fleet) -> dict:
    fleet.seed_everything(42)
    model = Net()  # drawn before setup, as Fabric's example does
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    model, optimizer = fleet.setup(model, optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    train, test = fleet.setup_dataloaders(DataLoader(images(64, 1), batch_size=8, shuffle=True),
                                          DataLoader(images(32, 2), batch_size=8))
    losses = []
    for _ in range(3):
        train_epoch(fleet, model, train, optimizer)
        scheduler.step()
        losses.append(test_loss(fleet, model, test, 32))
    return {"test_losses": losses, "weights": weights(model)}


def kfold(fleet: tf.Fleet, reset: str) -> dict:
    fleet.seed_everything(42)
    dataset = images(48, 3)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = fleet.setup(model, optimizer)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    losses = []
    for fold in range(3):
        val_ids = list(range(16 * fold, 16 * fold + 16))
        train_ids = [i for i in range(48) if i not in val_ids]
        if reset == "reset_parameters":
            for layer in model.modules():
                if hasattr(layer, "reset_parameters"):
                    layer.reset_parameters()
        else:
            model.load_state_dict(initial)
        train, val = fleet.setup_dataloaders(DataLoader(dataset, batch_size=4, sampler=SubsetRandomSampler(train_ids)),
                                             DataLoader(dataset, batch_size=4, sampler=SubsetRandomSampler(val_ids)))
        for _ in range(2):
            train_epoch(fleet, model, train, optimizer)
        losses.append(test_loss(fleet, model, val, len(val_ids)))
    return {"val_losses": losses, "weights": weights(model)}


def run(fleet: tf.Fleet, name: str) -> dict:
    return {"zero_grad": zero_grad_fleet(fleet), "distributions": distributions(fleet),
            "image": image_classifier(fleet), "kfold_reset_parameters": kfold(fleet, "reset_parameters"),
            "kfold_load_state_dict": kfold(fleet, "load_state_dict"), "zero_grad_trainer": zero_grad_trainer(name)}


def main(cfg: dict) -> None:
    ddp = tf.Fleet(strategy="ddp", accelerator="cpu", devices=2)
    ddp.launch()
    results = {"ddp": run(ddp, "ddp")}
    # the head a unit of its own (its Normal is what fully_shard could not see), and the conv layers of Net
    fsdp = tf.Fleet(strategy=FSDPStrategy(auto_wrap_policy={Head, nn.Conv2d}), accelerator="cpu", devices=2)
    results["fsdp"] = run(fsdp, "fsdp")
    root_only = tf.Fleet(strategy="fsdp", accelerator="cpu", devices=2)  # the root returns the Normal
    results["fsdp_root_distributions"] = distributions(root_only)
    results["fsdp_opaque_output"] = opaque_output(root_only)
    if ddp.global_rank == 0:
        torch.save(results, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
