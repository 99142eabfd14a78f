"""One training run for bench/preemption.py: trains until a preemption signal stops it.

Usage: python bench/_preempt_run.py STRATEGY DEVICES HIDDEN ROOT
Rank 0 creates ROOT/ready after 20 steps; the driver then signals the launching process.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf


class Net(tf.Module):
    def __init__(self, hidden: int, root: str) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 10))
        self.root = root

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 20 and self.global_rank == 0:
            open(os.path.join(self.root, "ready"), "w").close()
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def main(strategy: str, devices: int, hidden: int, root: str) -> None:
    torch.set_num_threads(1)
    tf.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(4096, 64, generator=g), torch.randint(0, 10, (4096,), generator=g))
    trainer = tf.Trainer(strategy=strategy, accelerator="cpu", devices=devices, max_epochs=-1, max_steps=10**9,
                         default_root_dir=root, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Net(hidden, root), DataLoader(data, batch_size=32, shuffle=True))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
