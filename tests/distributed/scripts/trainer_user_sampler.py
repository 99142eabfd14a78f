"""A Trainer fit under ddp on 2 processes with a SubsetRandomSampler of the user's, written once for both libraries.

Usage: python trainer_user_sampler.py LIBRARY OUT ("lightning" or "torchfleet"); each rank writes OUT.<rank>.json:
the (epoch, sample ids) of every training batch it ran and the sum of the weights after fit.
"""

from __future__ import annotations

import json
import sys

import torch
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

if sys.argv[1] == "lightning":
    from lightning.pytorch import LightningModule, Trainer, seed_everything
else:
    from torchfleet import Module as LightningModule
    from torchfleet import Trainer, seed_everything


class Recorder(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, batch[1].tolist()))
        return ((self.layer(batch[0]) - 1) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    seed_everything(3)
    data = TensorDataset(torch.arange(40.0).unsqueeze(1), torch.arange(40))
    model = Recorder()
    trainer = Trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=3, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=4, sampler=SubsetRandomSampler([i for i in range(40) if i % 4])))
    with open(f"{sys.argv[2]}.{trainer.global_rank}.json", "w") as f:
        json.dump({"seen": model.seen, "weight_sum": sum(p.sum().item() for p in model.parameters())}, f)
