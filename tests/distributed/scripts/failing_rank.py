"""A user's program whose training step raises on one rank; tests/distributed/test_failure_report.py runs it.

``python failing_rank.py '{"api": "trainer" | "fleet", "strategy": ..., "fail_rank": 1, "fleet_fn": false}'``: two
ranks on the CPU; rank ``fail_rank`` raises ValueError at its second batch. Fleet runs its loop in the script after
``fleet.launch()`` (or, with ``fleet_fn``, inside ``fleet.launch(train)``, as ddp_spawn needs).
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf

CFG = json.loads(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].startswith("{") else {}


def data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)), batch_size=8)


def check(rank: int, batch_idx: int) -> None:
    if rank == CFG["fail_rank"] and batch_idx == 1:
        raise ValueError(f"boom in rank {rank} at batch {batch_idx}")


class Net(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        check(self.global_rank, batch_idx)
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def train(fleet: tf.Fleet) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = fleet.setup(model, opt)
    for batch_idx, (x, y) in enumerate(fleet.setup_dataloaders(data())):
        check(fleet.global_rank, batch_idx)
        opt.zero_grad()
        fleet.backward(nn.functional.mse_loss(model(x), y))
        opt.step()


if __name__ == "__main__":
    if CFG["api"] == "trainer":
        trainer = tf.Trainer(accelerator="cpu", strategy=CFG["strategy"], devices=2, max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Net(), data())
    else:
        fleet = tf.Fleet(accelerator="cpu", strategy=CFG["strategy"], devices=2)
        if CFG.get("fleet_fn"):
            fleet.launch(train)
        else:
            fleet.launch()
            train(fleet)
