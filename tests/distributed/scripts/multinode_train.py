"""A tiny training run for the multi-node tests (tests/distributed/test_multinode.py), run as a script.

Usage: ``python multinode_train.py '<json>'`` with keys

* ``out`` (required): a directory. Every rank writes ``rank-n<node>-l<local>.json`` there (what it
  saw of the run), and global rank 0 writes ``result.json``: world size, the global ranks gathered
  from every process, and the final weights.
* ``devices`` (1), ``num_nodes`` (1), ``strategy`` ("ddp"), ``batch`` (per-rank batch size, 4),
  ``epochs`` (2), ``hang_timeout`` (the Trainer's default; scripts/stress_multinode_exit.py lowers it so that the
  watchdog thread calls the store more often).

The data are fixed (N_SAMPLES samples, no shuffling), the model is seeded, the loss is a mean MSE
and the optimizer plain SGD, so W ranks with batch B take exactly the steps that one process with
batch W*B takes: the tests compare the final weights of the two.

The script prints ``TRAINER_BUILT`` once the Trainer is constructed and each rank prints ``RANK_SETUP`` from the
Module's ``setup`` hook (after the process group is joined): the pre-flight tests check that a launch that disagrees
with devices x num_nodes fails in ``fit`` (where Lightning's launcher checks it), before any rank gets that far.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf

#: divisible by every global batch the tests use (4 x {1, 2, 4}) and by every world size
N_SAMPLES = 48


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(N_SAMPLES, 4, generator=g)
    y = torch.sin(x).sum(1, keepdim=True)
    return TensorDataset(x, y)


class TinyNet(tf.Module):
    """Linear -> tanh -> linear, mean-MSE loss, plain SGD."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def setup(self, stage):
        print("RANK_SETUP", flush=True)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _dump(path: str, payload: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    tf.seed_everything(0)
    out = cfg["out"]
    trainer = tf.Trainer(
        strategy=cfg.get("strategy", "ddp"), accelerator="cpu", devices=cfg.get("devices", 1),
        num_nodes=cfg.get("num_nodes", 1), max_epochs=cfg.get("epochs", 2),
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, **({"hang_timeout": cfg["hang_timeout"]} if "hang_timeout" in cfg else {}),
    )
    print("TRAINER_BUILT", flush=True)
    model = TinyNet()
    trainer.fit(model, DataLoader(make_data(), batch_size=cfg.get("batch", 4), shuffle=False))

    strategy = trainer.strategy
    me = torch.tensor([trainer.global_rank, trainer.node_rank, trainer.local_rank])
    gathered = strategy.all_gather(me)  # (world, 3) over the real process group; (1, 3) on one process
    info = {
        "global_rank": trainer.global_rank,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "world_size": trainer.world_size,
        "dist_world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "dist_rank": dist.get_rank() if dist.is_initialized() else 0,
        "environment": type(getattr(strategy, "cluster_environment", None)).__name__,
        "global_step": trainer.global_step,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "master_addr": os.environ.get("MASTER_ADDR"),
        "master_port": os.environ.get("MASTER_PORT"),
    }
    _dump(os.path.join(out, f"rank-n{trainer.node_rank}-l{trainer.local_rank}.json"), info)
    if trainer.is_global_zero:
        _dump(os.path.join(out, "result.json"), {
            **info,
            "ranks": [int(r) for r in gathered[:, 0]],
            "node_ranks": [int(r) for r in gathered[:, 1]],
            "local_ranks": [int(r) for r in gathered[:, 2]],
            "weights": {k: v.detach().double().flatten().tolist() for k, v in model.state_dict().items()},
        })
    print(f"DONE rank={trainer.global_rank} world={trainer.world_size}", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
