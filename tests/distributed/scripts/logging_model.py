"""A Module whose logged values differ per rank, for the logging and callback-agreement tests."""

from __future__ import annotations

import os

import torch
from torch import nn

import torchfleet as tf
from torchfleet.callbacks import Callback


class RankLogger(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        r = float(self.global_rank)
        for fx in ("mean", "sum", "max", "min"):
            self.log(f"rank_{fx}", r, reduce_fx=fx, sync_dist=True)
        # not synced, and different per rank: rank 0 gets better each epoch, rank 1 worse
        epoch = self.current_epoch
        self.log("local", float(-epoch if self.global_rank == 0 else epoch))
        self.log("zero_only", float(10 - epoch), rank_zero_only=True)

    def on_validation_epoch_end(self):
        # the collectives as a Module and a Trainer offer them; results logged as metrics for the test
        r = self.global_rank
        ragged = self.all_gather(torch.full((r + 1,), float(r)))  # rank r sends r+1 values
        self.barrier()
        self.log("ragged_total", float(sum(t.sum() for t in ragged)) + 100 * len(ragged))
        self.log("reduced_sum", self.all_reduce(torch.tensor(float(r + 1)), reduce_op="sum"))
        self.log("from_rank1", float(self.broadcast(10 * r + 7, src=1)))
        self.log("trainer_gather", self.trainer.all_gather(torch.tensor([float(r)])).sum())
        self.trainer.barrier()
        self.log("trainer_max", self.trainer.all_reduce({"v": float(r)}, reduce_op="max")["v"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class RankZeroWriter(Callback):
    """Does file work on rank 0 only, between collectives, as users' callbacks do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_validation_epoch_end(self, trainer, module):
        if trainer.is_global_zero:
            with open(self.path, "a") as f:
                f.write(f"{trainer.current_epoch}\n")
                f.flush()
                os.fsync(f.fileno())
