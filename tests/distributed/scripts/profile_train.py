"""Fit a small model under 2-process ddp once per profiler named; each rank writes its reports.

``python profile_train.py ROOT KIND [KIND ...]``: one launch, one fit per kind under ``ROOT/KIND``; rank 0 prints
``LOG_DIR KIND <log dir>`` after each (the ranks start once, so the three profilers cost one launch)."""

from __future__ import annotations

import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf


class Net(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(root: str, kinds: list[str]) -> None:
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    for kind in kinds:
        trainer = tf.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=2, profiler=kind,
                             default_root_dir=os.path.join(root, kind), enable_progress_bar=False,
                             enable_model_summary=False)
        trainer.fit(Net(), DataLoader(data, batch_size=4))
        if trainer.is_global_zero:
            print("LOG_DIR", kind, trainer.log_dir, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
