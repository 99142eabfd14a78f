"""A custom loop with Fleet under ddp, ddp_spawn or ddp_fork; rank 0 writes what the tests check.

Usage: python fleet_train.py STRATEGY OUT
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.distributed.scripts.ddp_train import make_data

EPOCHS = 2


def plain_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def fit(fleet, model: nn.Module) -> tuple:
    """Set ``model`` up and train it: SGD with momentum, 8 samples per rank, EPOCHS epochs; returns the set-up
    model and optimizer."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = fleet.setup(model, opt)
    loader = fleet.setup_dataloaders(DataLoader(make_data(), batch_size=8))
    for epoch in range(EPOCHS):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            fleet.backward(nn.functional.mse_loss(model(x), y))
            opt.step()
    return model, opt


def train(fleet, out: str) -> dict:
    model, _ = fit(fleet, plain_net())
    rank = torch.tensor([float(fleet.global_rank)])
    result = {
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "gathered": fleet.all_gather(rank).flatten().tolist(),
        # rank r contributes r+1 rows: a gather of tensors whose first dimension differs per rank
        "uneven": [t.flatten().tolist() for t in fleet.all_gather(torch.full((fleet.global_rank + 1,), rank.item()))],
        "sum": float(fleet.all_reduce(rank + 1, reduce_op="sum")),
        "max": float(fleet.all_reduce(rank, reduce_op="max")),
        "broadcast": fleet.broadcast({"from": fleet.global_rank}, src=1),
        "world_size": fleet.world_size,
    }
    fleet.barrier()
    if fleet.is_global_zero:
        torch.save(result, out)
    return result


def main(strategy: str, out: str) -> None:
    import torchfleet as tf

    torch.set_num_threads(1)
    fleet = tf.Fleet(strategy=strategy, accelerator="cpu", devices=2)
    if strategy == "ddp":
        fleet.launch()
        train(fleet, out)
    else:
        fleet.launch(train, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
