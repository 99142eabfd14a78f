"""A Trainer run that one rank (or the launching process) sends a real preemption signal to, driven by JSON.

Options: strategy (ddp, ddp_spawn, fsdp, ...), devices, root (default_root_dir), out (rank 0 saves the final weights there when fit
returns), signal_rank (-1: none), signal_step, signal ("SIGTERM" | "SIGUSR1"), signal_target ("self" |
"parent": the launching process of ddp_spawn/ddp_fork), epochs, die_in_save_rank (that rank exits with
code 3 in the middle of the preemption save). The restart count comes from the
environment (SLURM_RESTART_COUNT), as on a cluster.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf


class DieInSave(tf.callbacks.Callback):
    """One rank dies for real while the ranks write the preemption checkpoint."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def on_save_checkpoint(self, trainer, module, checkpoint):
        if trainer.global_rank == self.rank:
            os._exit(3)


class Net(tf.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 1))
        self.signal_rank = cfg.get("signal_rank", -1)
        self.signal_step = cfg.get("signal_step", 3)
        self.signal = getattr(signal, cfg.get("signal", "SIGTERM"))
        self.parent = cfg.get("signal_target") == "parent"

    def training_step(self, batch, batch_idx):
        if self.global_rank == self.signal_rank and self.trainer.global_step == self.signal_step:
            os.kill(os.getppid() if self.parent else os.getpid(), self.signal)
            if self.parent:
                # the launching process forwards it: wait (bounded) until it reached this rank, so the step the
                # ranks stop after does not depend on how busy the machine is
                deadline = time.monotonic() + 30
                while self.trainer._preemption.flag.signum is None and time.monotonic() < deadline:
                    time.sleep(0.01)
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def regression_data() -> TensorDataset:
    """64 samples of 4 features, the same in every process."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 4, generator=g)
    return TensorDataset(x, torch.sin(x).sum(1, keepdim=True))


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    tf.seed_everything(0)
    data = regression_data()
    model = Net(cfg)
    trainer = tf.Trainer(
        strategy=cfg.get("strategy", "ddp"), accelerator=cfg.get("accelerator", "cpu"), devices=cfg.get("devices", 2),
        max_epochs=cfg.get("epochs", 2), default_root_dir=cfg["root"], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[DieInSave(cfg["die_in_save_rank"])] if "die_in_save_rank" in cfg else None,
    )
    trainer.fit(model, DataLoader(data, batch_size=8, shuffle=True))
    # fsdp keeps its shards after fit: every rank takes part in gathering the whole tensors
    weights = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    if trainer.is_global_zero:
        torch.save({"weights": weights, "global_step": trainer.global_step,
                    "resumed_from": trainer.ckpt_path}, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
