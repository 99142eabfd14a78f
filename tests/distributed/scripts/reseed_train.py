"""A Lightning-style program that draws random numbers between ``seed_everything`` and ``fit``, run under
torchfleet or Lightning (``cfg["lib"]``), so the two libraries' results can be compared.

The draws stand for a replay buffer's warm-up: Lightning's ddp, fsdp and deepspeed strategies re-seed at setup
(``reset_seed``), so there they do not shift training; its single-device strategy does not. The model has dropout
and the training loader shuffles, so both the sampler and the steps read the generators; the validation loader
and the sanity check (``cfg["sanity"]`` batches) read them too, which Lightning's ``isolate_rng`` undoes.

``python reseed_train.py '<cfg as JSON>'``: keys ``lib`` ("torchfleet" or "lightning"), ``strategy``,
``devices``, ``warmup`` (draw or not), ``sanity`` (num_sanity_val_steps), ``out`` (rank 0 writes the weights
there), and optionally ``loaders: "dict"``: two training loaders in a dict (combined as Lightning's
"max_size_cycle", each with its own distributed sampler under ddp). With ``runs`` (a list of such keys, each with
its own ``out``), one launch fits them in turn, each from ``seed_everything`` on, as separate launches would. Under Lightning only Lightning is imported, so the script runs in a virtual environment without torchfleet.
"""

from __future__ import annotations

import json
import random
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

cfg = json.loads(sys.argv[1])
if cfg["lib"] == "lightning":
    import lightning.pytorch as pl

    Module = pl.LightningModule
else:
    import torchfleet as pl

    Module = pl.Module


class Net(Module):
    def __init__(self, dropout: float = 0.3) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        if isinstance(batch, dict):  # one batch of each loader
            return sum(nn.functional.mse_loss(self.net(x), y) for x, y in batch.values())
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data(seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 6, generator=g)
    return TensorDataset(x, x @ torch.randn(6, 1, generator=g))


def main(cfg: dict) -> None:
    pl.seed_everything(7)
    model = Net(cfg.get("dropout", 0.3))
    if cfg["warmup"]:  # a replay buffer filled before training
        torch.randn(100)
        random.random()
        np.random.rand(3)
    trainer = pl.Trainer(accelerator="cpu", devices=cfg["devices"], strategy=cfg["strategy"], max_epochs=2,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=cfg["sanity"])
    train = DataLoader(data(0), batch_size=4, shuffle=True)
    if cfg.get("loaders") == "dict":
        train = {"a": train, "b": DataLoader(data(2), batch_size=2, shuffle=True)}
    trainer.fit(model, train, DataLoader(data(1), batch_size=4))
    if trainer.global_rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, cfg["out"])


if __name__ == "__main__":
    for run in cfg.get("runs", [{}]):
        main({**{k: v for k, v in cfg.items() if k != "runs"}, **run})
