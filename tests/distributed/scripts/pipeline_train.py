"""A 5-layer MLP under ModelParallelStrategy(pipeline_parallel_size=2), driven by a JSON argument.

The data, global batch, steps and checkpoint step are model_parallel_train.py's: every run sees the same
batches in the same steps and must end with the one-process weights. Every run is one entry of ``cfg["runs"]``:

- ``{"name", "strategy": "model_parallel" | "single_device", "pp": int, "dp": int, "tp": int}`` (``tp`` > 1:
  the stages' Linear layers column- then row-wise tensor parallel);
- ``"schedule"``: the pipeline schedule; ``"microbatches"``: their number; ``"clip"``: ``gradient_clip_val``;
  ``"stages_per_rank"`` and ``"split"`` (the split points, default ``["layers.2"]``) for a multi-stage schedule;
  ``"shard_whole": true``: ``fully_shard`` the whole Module, not its stages;
- ``"save_at": step`` with ``"ckpt_dir"``: write ``ckpt_dir/<name>.ckpt`` after that optimizer step;
- ``"resume": path``: resume from a checkpoint and train to the end;
- ``"log_loss": false``: no ``log_loss_as`` (the training loss's broadcast overlaps the optimizer step);
- ``"validate": true``: give a validation loader (its loss logged as ``val_loss``); ``"expect_error": true``: the
  run must fail (``{"error": ...}``);
- ``"fleet": true``: a Fleet loop (``ModelParallelStrategy(shard, pipeline=SPEC)`` when ``pp`` > 1,
  ``fleet.strategy.pipeline_step``) that writes ``ckpt_dir/<name>.ckpt`` with ``fleet.save`` at
  ``SAVE_AT``, then finishes in a fresh model loaded with ``fleet.load`` from ``"resume"`` (default: that file),
  and ends with one forward-only step over ``EVAL_SAMPLES`` samples.

Rank 0 writes ``cfg["out"]``: per run the whole weights (the union of the stages'), the global step, the
``train_loss`` (and ``val_loss``) the Trainer logged last, each rank's parameter names and the losses
``on_train_batch_end`` saw; for a Fleet run the weights, steps, each rank's losses and the evaluation loss.
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
    fleet_train,
    full_weights,
    make_data,
)
from tests.distributed.trainer_order import InOrder
from torchfleet.callbacks import Callback
from torchfleet.strategies import PipelineSpec

#: Fleet's split, given to the strategy
SPEC = PipelineSpec(split_points=["layers.2"], loss_fn=nn.functional.mse_loss)
#: the Fleet runs' final forward-only step reads the first samples, the same on every rank
EVAL_SAMPLES = 8


def make_layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


class Stack(tf.Module):
    """Linear-Tanh-Linear-Tanh-Linear in one Sequential; stage 1 begins at ``layers.2`` under pipeline parallel."""

    def __init__(self, split_points: list[str] | None = None, shard_whole: bool = False, log_loss: bool = True) -> None:
        super().__init__()
        self.layers = make_layers()
        self.split_points = split_points or ["layers.2"]
        self.shard_whole = shard_whole  # fully_shard the Module even under a multi-stage schedule (refused)
        self.log_loss = log_loss  # False: the training loss is not logged, so its broadcast overlaps the step

    def forward(self, x):
        return self.layers(x)

    def configure_pipeline(self):
        return PipelineSpec(split_points=self.split_points, loss_fn=nn.functional.mse_loss,
                            log_loss_as="train_loss" if self.log_loss else None, log_val_loss_as="val_loss")

    def configure_model(self):
        mesh = self.device_mesh
        if mesh is None:  # the same Module trains under single_device
            return
        if mesh["tensor_parallel"].size() > 1:
            from torch.distributed.tensor import Replicate
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            # stage 0 sends its whole activation to stage 1; each rank parallelises the layers its stage kept
            plan = {"layers.0": ColwiseParallel(output_layouts=Replicate()), "layers.2": ColwiseParallel(),
                    "layers.4": RowwiseParallel()}
            kept = dict(self.named_modules())
            parallelize_module(self, mesh["tensor_parallel"], {k: v for k, v in plan.items() if k in kept})
        if self.shard_whole:
            from torch.distributed.fsdp import fully_shard

            fully_shard(self, mesh=mesh["data_parallel"])
            return
        shard(self, mesh)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

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
                                         microbatches=run.get("microbatches"),
                                         stages_per_rank=run.get("stages_per_rank", 1))
    trainer = tf.Trainer(strategy=strategy, accelerator="cpu", devices=devices, max_epochs=EPOCHS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, gradient_clip_val=run.get("clip"), callbacks=list(callbacks))
    data = make_data()
    dp = run.get("dp", 1)
    train = DataLoader(data, batch_size=GLOBAL_BATCH // dp, sampler=InOrder(data))
    val = DataLoader(data, batch_size=4) if run.get("validate") else None
    return Stack(run.get("split"), run.get("shard_whole", False), run.get("log_loss", True)), trainer, train, val


def gathered(strategy, model: nn.Module, losses: list[float]) -> dict:
    """The whole weights (the union of the stages'), each rank's parameter names and each rank's losses."""
    weights = full_weights(model)  # a collective over the data-parallel dimension: every rank
    ranks = strategy.all_gather_object(weights) if strategy.world_size > 1 else [weights]
    return {"weights": {k: v for rank in ranks for k, v in rank.items()}, "names": [sorted(rank) for rank in ranks],
            "losses": strategy.all_gather_object(losses) if strategy.world_size > 1 else [losses]}


def record(model: nn.Module, trainer, callbacks) -> dict:
    metrics = trainer.callback_metrics
    return {**gathered(trainer.strategy, model, callbacks[0].losses), "global_step": trainer.global_step,
            "train_loss": float(metrics["train_loss"]) if "train_loss" in metrics else None,
            "val_loss": float(metrics["val_loss"]) if "val_loss" in metrics else None,
            # the loss's broadcast was left to overlap the optimizer step (a Module without log_loss_as)
            "loss_deferred": bool(getattr(getattr(trainer.strategy, "_pipeline", None), "defer_loss", False)
                                  and not model.log_loss)}


def shard(module: nn.Module, mesh) -> nn.Module:
    """fully_shard over the data-parallel dimension: each of the rank's stages under a multi-stage schedule."""
    from torch.distributed.fsdp import fully_shard

    for unit in getattr(module, "pipeline_stages", None) or [module]:
        fully_shard(unit, mesh=mesh["data_parallel"])
    return module


def fleet_run(run: dict, devices: int) -> dict:
    """A Fleet loop (fleet_train's), pipelined by ``pipeline_step`` when ``pp`` > 1; ends with a forward-only step."""
    from torchfleet.strategies import ModelParallelStrategy

    pp = run.get("pp", 1)

    def step_fn(fleet, model, batch):
        if pp > 1:
            return float(fleet.strategy.pipeline_step(model, batch))  # forward and backward (no_grad: forward only)
        loss = nn.functional.mse_loss(model(batch[0]), batch[1])
        if torch.is_grad_enabled():
            fleet.backward(loss)
        return float(loss)

    # the spec given to the strategy (not the Module's configure_pipeline, which it overrides)
    strategy = ModelParallelStrategy(shard, data_parallel_size=run.get("dp", 1), tensor_parallel_size=1,
                                     pipeline_parallel_size=pp, pipeline=SPEC if pp > 1 else None)
    fleet, model, steps, losses, data = fleet_train(strategy, Stack, run, devices, step_fn)
    with torch.no_grad():
        val_loss = step_fn(fleet, model, fleet.to_device(data[:EVAL_SAMPLES]))
    return {**gathered(fleet.strategy, model, losses), "global_step": steps, "val_loss": val_loss, "mesh": None}


def main(cfg: dict) -> None:
    fit_runs(cfg, build, record, lambda: [Losses()], fleet_run)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
