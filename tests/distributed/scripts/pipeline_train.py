"""A 5-layer MLP under ModelParallelStrategy(pipeline_parallel_size=2), driven by a JSON argument.

The data, global batch, steps and checkpoint step are model_parallel_train.py's: every run sees the same
batches in the same steps and must end with the one-process weights. Every run is one entry of ``cfg["runs"]``:

- ``{"name", "strategy": "model_parallel" | "single_device", "pp": int, "dp": int, "tp": int}``;
- ``"schedule"``: the pipeline schedule; ``"microbatches"``: their number; ``"clip"``: ``gradient_clip_val``;
- ``"save_at": step`` with ``"ckpt_dir"``: write ``ckpt_dir/<name>.ckpt`` after that optimizer step;
- ``"resume": path``: resume from a checkpoint and train to the end;
- ``"validate": true``: give a validation loader; ``"expect_error": true``: the run must fail (``{"error": ...}``).

Rank 0 writes ``cfg["out"]``: per run the whole weights (the union of the stages'), the global step, the
``train_loss`` the Trainer logged last, each rank's parameter names and the losses ``on_train_batch_end`` saw.
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

import torchfleet as tf
from tests.distributed.scripts.model_parallel_train import (
    DIM,
    EPOCHS,
    GLOBAL_BATCH,
    HIDDEN,
    fit_runs,
    full_weights,
    make_data,
)
from tests.distributed.trainer_order import InOrder
from torchfleet.callbacks import Callback
from torchfleet.strategies import PipelineSpec


class Stack(tf.Module):
    """Linear-Tanh-Linear-Tanh-Linear in one Sequential; stage 1 begins at ``layers.2`` under pipeline parallel."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                                    nn.Linear(HIDDEN, 1))

    def forward(self, x):
        return self.layers(x)

    def configure_pipeline(self):
        return PipelineSpec(split_points=["layers.2"], loss_fn=nn.functional.mse_loss, log_loss_as="train_loss")

    def configure_model(self):
        if self.device_mesh is not None:  # the same Module trains under single_device
            from torch.distributed.fsdp import fully_shard

            fully_shard(self, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.02, weight_decay=0.01)


class Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs))


def build(run: dict, devices: int, callbacks=()):
    from torchfleet.strategies import ModelParallelStrategy

    strategy = run["strategy"]
    if strategy == "model_parallel":
        strategy = ModelParallelStrategy(data_parallel_size=run.get("dp", "auto"),
                                         tensor_parallel_size=run.get("tp", 1),
                                         pipeline_parallel_size=run.get("pp", 1),
                                         pipeline_schedule=run.get("schedule", "1F1B"),
                                         microbatches=run.get("microbatches"))
    trainer = tf.Trainer(strategy=strategy, accelerator="cpu", devices=devices, max_epochs=EPOCHS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, gradient_clip_val=run.get("clip"), callbacks=list(callbacks))
    data = make_data()
    dp = run.get("dp", 1)
    train = DataLoader(data, batch_size=GLOBAL_BATCH // dp, sampler=InOrder(data))
    val = DataLoader(data, batch_size=4) if run.get("validate") else None
    return Stack(), trainer, train, val


def record(model: nn.Module, trainer, callbacks) -> dict:
    weights = full_weights(model)  # a collective over the data-parallel dimension: every rank
    ranks = trainer.strategy.all_gather_object(weights) if trainer.world_size > 1 else [weights]
    losses = callbacks[0].losses
    return {
        "weights": {k: v for rank in ranks for k, v in rank.items()},
        "names": [sorted(rank) for rank in ranks],
        "global_step": trainer.global_step,
        "train_loss": float(trainer.callback_metrics["train_loss"]),
        "losses": trainer.strategy.all_gather_object(losses) if trainer.world_size > 1 else [losses],
    }


def main(cfg: dict) -> None:
    fit_runs(cfg, build, record, lambda: [Losses()])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
