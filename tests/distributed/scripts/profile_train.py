"""Fit a small model under 2-process ddp with a profiler; each rank writes its report. Argument: the root dir."""

from __future__ import annotations

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


def main(root: str, kind: str) -> None:
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    trainer = tf.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=2, profiler=kind,
                         default_root_dir=root, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Net(), DataLoader(data, batch_size=4))
    if trainer.is_global_zero:
        print("LOG_DIR", trainer.log_dir)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
