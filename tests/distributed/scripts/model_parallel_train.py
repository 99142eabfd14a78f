"""A small MLP block under ModelParallelStrategy (tensor parallel + FSDP2), driven by a JSON argument.

One launch trains several runs in turn (ranks and process group started once; each run builds a new
Trainer, strategy and mesh). The global batch is ``GLOBAL_BATCH`` at every mesh (per-rank batch =
GLOBAL_BATCH / data_parallel_size, read in order), so every run sees the same batches in the same steps
and must end with the one-process weights. Every run is one entry of ``cfg["runs"]``:

- ``{"name", "strategy": "model_parallel" | "single_device" | "fsdp" | "ddp", "dp": int, "tp": int}``;
- ``"save_at": step`` with ``"ckpt_dir"``: write ``ckpt_dir/<name>.ckpt`` after that optimizer step;
  ``"distributed": false``: one file (``save_distributed_checkpoint=False``);
- ``"resume": path``: resume from a checkpoint and train to the end;
- ``"clip": value``: ``gradient_clip_val``; ``"accumulate": n``: ``accumulate_grad_batches``;
- ``"fleet": true``: a Fleet loop (``ModelParallelStrategy(parallelize, ...)``) that saves at ``SAVE_AT`` with
  ``fleet.save`` and finishes in a fresh model loaded with ``fleet.load``;
- ``"hidden": n``: the feed-forward's width; ``"unconfigured": true``: a Module without ``configure_model``;
- ``"expect_error": true``: the run must fail; its entry is ``{"error": message}``.

Rank 0 writes ``cfg["out"]`` (torch.save): per run the final whole weights, global step, val_loss, what each rank
read (the sum of each training batch), the placements of the parameters and the shape ``all_gather`` gave.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf
from tests.distributed.trainer_order import InOrder
from torchfleet.callbacks import Callback

DIM, HIDDEN, N_SAMPLES = 8, 16, 32
#: 4 steps an epoch at any mesh, 2 epochs
GLOBAL_BATCH, EPOCHS = 8, 2
STEPS = EPOCHS * N_SAMPLES // GLOBAL_BATCH
#: mid-epoch: checkpoints are written after this optimizer step
SAVE_AT = 3


def make_data(n: int = N_SAMPLES) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, DIM, generator=g)
    return TensorDataset(x, x.sin().sum(-1, keepdim=True))


def parallelize(module: nn.Module, mesh) -> nn.Module:
    """Column- then row-wise tensor parallel feed-forward, then FSDP2 over the data-parallel dimension."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(module, mesh["tensor_parallel"], {"ff_in": ColwiseParallel(), "ff_out": RowwiseParallel()})
    fully_shard(module, mesh=mesh["data_parallel"])
    return module


class Block(tf.Module):
    """LayerNorm, a feed-forward of width ``hidden`` (the tensor-parallel part), a residual and a linear head.

    The LayerNorm and the head are not tensor parallel: their DTensors live on the data-parallel dimension only,
    the feed-forward's on both, so gradient clipping must combine norms from two meshes.
    """

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.LayerNorm(DIM)
        self.ff_in = nn.Linear(DIM, hidden)
        self.ff_out = nn.Linear(hidden, DIM)
        self.head = nn.Linear(DIM, 1)
        self.seen: list[float] = []
        self.gathered_shape = None

    def forward(self, x):
        return self.head(x + self.ff_out(torch.relu(self.ff_in(self.norm(x)))))

    def configure_model(self):
        if self.device_mesh is not None:  # None under single_device, fsdp, ddp: the same Module trains there
            parallelize(self, self.device_mesh)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append(float(x.sum()))
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.gathered_shape = tuple(self.all_gather(loss).shape)
        self.log("val_loss", loss, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.02, weight_decay=0.01)


class Unconfigured(Block):
    """A Module that leaves configure_model as the base class's (ModelParallelStrategy refuses it)."""

    configure_model = tf.Module.configure_model


def full_weights(module: nn.Module) -> dict:
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().float().clone()
            for k, v in module.state_dict().items()}


def placements(module: nn.Module) -> dict:
    from torch.distributed.tensor import DTensor

    return {n: (tuple(p.device_mesh.mesh_dim_names), tuple(str(x) for x in p.placements))
            if isinstance(p, DTensor) else None for n, p in module.named_parameters()}


class SaveAt(Callback):
    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


class Describe(Callback):
    def __init__(self) -> None:
        self.params = None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.params = placements(module)


def make_strategy(run: dict):
    from torchfleet.strategies import ModelParallelStrategy

    if run["strategy"] != "model_parallel":
        return run["strategy"]
    return ModelParallelStrategy(data_parallel_size=run.get("dp", "auto"), tensor_parallel_size=run.get("tp", "auto"),
                                 save_distributed_checkpoint=run.get("distributed", True))


def build(run: dict, devices: int, callbacks=()):
    """The model, trainer and loaders of one run (the tests build the one-process reference with it too)."""
    trainer = tf.Trainer(
        strategy=make_strategy(run), accelerator="cpu", devices=devices, max_epochs=EPOCHS, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        gradient_clip_val=run.get("clip"), accumulate_grad_batches=run.get("accumulate", 1), callbacks=list(callbacks),
    )
    model = Unconfigured() if run.get("unconfigured") else Block(run.get("hidden", HIDDEN))
    data = make_data()
    dp = run.get("dp", 1) if run["strategy"] == "model_parallel" else devices  # "auto" on one node: 1
    train = DataLoader(data, batch_size=GLOBAL_BATCH // dp, sampler=InOrder(data))
    val = DataLoader(TensorDataset(*data[:16]), batch_size=4)
    return model, trainer, train, val


def fleet_train(strategy, make_model, run: dict, devices: int, step_fn) -> tuple:
    """A Fleet loop: train on the global batch, ``fleet.save`` at SAVE_AT to ``ckpt_dir/<name>.ckpt``, then finish in a
    fresh model and optimizer loaded with ``fleet.load`` from ``run["resume"]`` (default: that file).

    ``step_fn(fleet, model, batch) -> float`` runs forward and backward and returns what the run records for the
    batch. Returns ``(fleet, model, steps, records, data)``. pipeline_train.py's Fleet runs use it too.
    """
    fleet = tf.Fleet(strategy=strategy, accelerator="cpu", devices=devices)
    fleet.launch()
    data = make_data()
    dp = strategy.data_parallel_size
    loader = fleet.setup_dataloaders(DataLoader(data, batch_size=GLOBAL_BATCH // dp, sampler=InOrder(data)))
    ckpt = os.path.join(run["ckpt_dir"], f"{run['name']}.ckpt")

    def setup():
        model = fleet.setup_module(make_model())
        return model, fleet.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.01))

    model, optimizer = setup()
    step, records = 0, []
    for _ in range(EPOCHS):
        for batch in loader:
            if step == SAVE_AT:
                fleet.save(ckpt, {"model": model, "optimizer": optimizer, "step": step})
                model, optimizer = setup()  # a fresh model: everything must come from the checkpoint
                state = {"model": model, "optimizer": optimizer, "step": 0}
                fleet.load(run.get("resume", ckpt), state)
                step = state["step"]
            records.append(step_fn(fleet, model, batch))
            optimizer.step()
            optimizer.zero_grad()
            step += 1
    return fleet, model, step, records, data


def fleet_run(run: dict, devices: int) -> dict:
    """Fleet: train, save at SAVE_AT; a fresh model and optimizer load that checkpoint and finish the epochs."""
    from torchfleet.strategies import ModelParallelStrategy

    def step_fn(fleet, model, batch):
        x, y = batch
        fleet.backward(nn.functional.mse_loss(model(x), y))
        return float(x.sum())

    strategy = ModelParallelStrategy(parallelize, data_parallel_size=run.get("dp", 1),
                                     tensor_parallel_size=run.get("tp", devices))
    fleet, model, step, seen, _ = fleet_train(strategy, Block, run, devices, step_fn)
    return {"weights": full_weights(model), "global_step": step,
            "seen": fleet.strategy.all_gather_object(seen),
            "params": placements(model)}


def fit_runs(cfg: dict, build, record, callbacks_for, fleet_run=None) -> None:
    """Run each of ``cfg["runs"]`` (seeded alike; a "save_at" run checkpoints there, an "expect_error" run records its
    error, a "fleet" run goes to ``fleet_run``); rank 0 saves ``{name: record(model, trainer, callbacks)}`` with each
    run's mesh to ``cfg["out"]``. pipeline_train.py drives its runs through it too."""
    torch.set_num_threads(1)
    results, devices = {}, cfg.get("devices", 4)
    for run in cfg["runs"]:
        name = run["name"]
        tf.seed_everything(0)
        if run.get("fleet"):
            results[name] = fleet_run(run, devices)
            continue
        callbacks = callbacks_for()
        if run.get("save_at"):
            callbacks.append(SaveAt(run["save_at"], os.path.join(run["ckpt_dir"], f"{name}.ckpt")))
        model, trainer, train, val = build(run, devices, callbacks)
        try:
            trainer.fit(model, train, val, ckpt_path=run.get("resume"))
        except Exception as exc:
            if not run.get("expect_error"):
                raise
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        mesh = model.device_mesh
        results[name] = {**record(model, trainer, callbacks),
                         "mesh": None if mesh is None else (tuple(mesh.mesh_dim_names), tuple(mesh.shape))}
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        torch.save(results, cfg["out"])


def record(model: nn.Module, trainer, callbacks) -> dict:
    return {
        "weights": full_weights(model),
        "global_step": trainer.global_step,
        "val_loss": float(trainer.callback_metrics["val_loss"]),
        "seen": trainer.strategy.all_gather_object(model.seen),
        "gathered_shape": model.gathered_shape,
        "params": callbacks[0].params,
    }


def main(cfg: dict) -> None:
    fit_runs(cfg, build, record, lambda: [Describe()], fleet_run)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
