"""A small training run driven by a JSON argument; the multi-process tests run it as a script.

Rank 0 writes what the tests check to ``out`` (torch.save): final weights, step count, synced
metrics, the number of gradient all-reduces, the gathered ranks. Options (all optional except
``out``): strategy, devices, num_nodes, batch, epochs, accumulate, shuffle, fail_rank, fail_how
("raise" | "kill" | "exit"), fail_step, comm_count, max_port_wait, started_fd (rank 0 writes a byte
there at step 2), also: a list of option sets (each with its own ``out``) that the same launch fits afterwards,
each from a fresh seed-0 model, in the ranks and process group already running (one launch, several runs).
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf

N_SAMPLES = 64
#: the validation set does not divide evenly between 2 ranks: exact evaluation must count 63, not 64
N_VAL = 63


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(N_SAMPLES, 4, generator=g)
    y = torch.sin(x).sum(1, keepdim=True)
    return TensorDataset(x, y)


class Net(tf.Module):
    """Tanh MLP with a mean-MSE loss; logs the loss with sync_dist and optionally fails on one rank."""

    def __init__(self, fail_rank: int = -1, fail_how: str = "raise", fail_step: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
        self.fail_rank, self.fail_how, self.fail_step = fail_rank, fail_how, fail_step
        #: a pipe's write end (a file descriptor) through which rank 0 tells a test that training runs
        self.started_fd = -1

    def training_step(self, batch, batch_idx):
        if self.started_fd >= 0 and self.global_rank == 0 and self.trainer.global_step == 2:
            os.write(self.started_fd, b"1")
            os.close(self.started_fd)
            self.started_fd = -1
        if self.global_rank == self.fail_rank and self.trainer.global_step == self.fail_step:
            if self.fail_how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fail_how == "exit":
                os._exit(3)
            raise ValueError(f"boom in rank {self.global_rank} at step {self.trainer.global_step}")
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)
        self.log("val_seen", float(len(x)), reduce_fx="sum", sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class CommCounter:
    """State of a DDP communication hook that counts gradient all-reduces (buckets)."""

    def __init__(self) -> None:
        self.calls = 0


def counting_allreduce(state: CommCounter, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    state.calls += 1
    return allreduce_hook(None, bucket)


def build(cfg: dict, strategy=None):
    """The model, trainer and dataloaders a run with ``cfg`` uses (shared with the in-process tests)."""
    model = Net(cfg.get("fail_rank", -1), cfg.get("fail_how", "raise"), cfg.get("fail_step", 1))
    data = make_data()
    trainer = tf.Trainer(
        strategy=strategy or cfg.get("strategy", "ddp"), accelerator=cfg.get("accelerator", "cpu"),
        devices=cfg.get("devices", 2),
        num_nodes=cfg.get("num_nodes", 1), max_epochs=cfg.get("epochs", 2),
        accumulate_grad_batches=cfg.get("accumulate", 1), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )
    if cfg.get("reference_of"):  # one process reading the global batches of a run on that many ranks
        from tests.distributed.trainer_order import TrainerOrder

        world = cfg["reference_of"]
        train = DataLoader(data, batch_sampler=TrainerOrder(len(data), world, cfg.get("batch", 8) // world))
    else:
        train = DataLoader(data, batch_size=cfg.get("batch", 8), shuffle=cfg.get("shuffle", False))
    val = DataLoader(TensorDataset(*data[:N_VAL]), batch_size=5)
    return model, trainer, train, val


def main(cfg: dict) -> None:
    if cfg.get("verbose"):
        import logging

        logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(1)
    fit_and_save(cfg)
    for extra in cfg.get("also", []):
        fit_and_save({k: v for k, v in cfg.items() if k not in ("also", "twice", "out")} | extra)


def fit_and_save(cfg: dict) -> None:
    tf.seed_everything(0)
    counter = CommCounter()
    strategy = None
    if cfg.get("comm_count"):
        strategy = tf.strategies.DDPStrategy(ddp_comm_hook=counting_allreduce, ddp_comm_state=counter)
    model, trainer, train, val = build(cfg, strategy)
    model.started_fd = cfg.get("started_fd", -1)
    trainer.fit(model, train, val)
    if cfg.get("twice"):
        # a second Trainer in the same script: under ddp it joins the ranks (and process group) already running
        model, trainer, train, val = build(cfg, strategy)
        trainer.fit(model, train, val)
    ranks = trainer.strategy.all_gather(torch.tensor([trainer.global_rank]))
    if trainer.is_global_zero:
        torch.save({
            "weights": {k: v.clone() for k, v in model.state_dict().items()},
            "global_step": trainer.global_step,
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "comm_calls": counter.calls,
            "ranks": ranks.flatten().tolist(),
            "world_size": trainer.world_size,
        }, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
