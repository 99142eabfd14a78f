"""Small transformer runs under DeepSpeed strategies, driven by a JSON argument; the DeepSpeed tests run it as a script.

One launch trains several runs in turn (the ranks and process group are started once; each run
builds a new Trainer and DeepSpeed engine). Every run is one entry of ``cfg["runs"]``:

- ``{"name", "strategy", "save_at": step, "ckpt_dir": dir}``: train ``STEPS`` steps from scratch;
  with ``save_at``, write a checkpoint at that global step to ``ckpt_dir/<name>.ckpt``.
- ``{"name", "strategy", "resume": path}``: resume from a checkpoint directory and train to the end.
- ``"expect_error": true``: the run must fail; its entry is ``{"error": message}``.
- ``"precision"``, ``"accumulate"``, ``"max_steps"``: the Trainer's precision, accumulate_grad_batches, max_steps.
- ``"optimizer"``: a key of ``OPTIMIZERS`` (default ``"adamw"``).
- ``"ds_accelerator": "cuda"``: select DeepSpeed's CUDA accelerator before the run, as DeepSpeed does by
  itself on a GPU host (the run still asks for accelerator="cpu").
- ``{"name", "strategy", "validate": path}``: ``trainer.validate`` with the weights of a checkpoint.
- ``{"name", "strategy", "fleet": true, "ckpt_dir"}``: the same model in a hand-written Fleet loop
  (no LR schedule) that saves at step ``SAVE_AT``; a fresh engine loads that and finishes.

Rank 0 writes ``cfg["out"]`` (torch.save): per run, the final full weights (gathered), the global
step, the world size, and the weights at the save step when one was written.
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

try:
    from tests.distributed.scripts.fleet_resume import train_save_resume
except ImportError:  # run as a script from its folder
    from fleet_resume import train_save_resume  # type: ignore[no-redef]

N_SAMPLES = 48
SEQ, DIM = 4, 8
#: per-rank batch 4 on 2 ranks: 6 steps an epoch, 2 epochs
BATCH, EPOCHS = 4, 2
#: where the runs that save a checkpoint write it (after this optimizer step)
SAVE_AT = 3


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(N_SAMPLES, SEQ, DIM, generator=g)
    y = x.flip(1).mean(-1, keepdim=True)
    return TensorDataset(x, y)


#: torch optimizers the runs can use: ZeRO's partitions must carry any of their state keys
OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.02, weight_decay=0.01),
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adagrad": lambda params: torch.optim.Adagrad(params, lr=0.05),
    "rmsprop": lambda params: torch.optim.RMSprop(params, lr=0.01, momentum=0.5, centered=True),
}


class TinyTransformer(tf.Module):
    """One encoder layer and a linear head, trained with one of ``OPTIMIZERS`` (AdamW by default).

    The encoder has no biases: the attention's key bias gets a gradient that is exactly zero in
    theory and rounding noise in practice, which Adam would blow up to lr-sized steps that differ
    between any two summation orders, hiding the comparison this model is for.
    """

    def __init__(self, optimizer: str = "adamw") -> None:
        super().__init__()
        self.optimizer_name = optimizer
        torch.manual_seed(0)
        self.encoder = nn.TransformerEncoderLayer(DIM, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True,
                                                  bias=False)
        self.head = nn.Linear(DIM, 1)
        self.batches_run = 0

    def forward(self, x):
        return self.head(self.encoder(x))

    def training_step(self, batch, batch_idx):
        self.batches_run += 1
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        opt = OPTIMIZERS[self.optimizer_name](self.parameters())
        # a per-step schedule: resuming must restore it too
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class SaveAt(Callback):
    """Writes ``trainer.save_checkpoint(path)`` once, after the optimizer step that reaches ``step``."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path, self.weights = step, path, None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and self.weights is None:
            trainer.save_checkpoint(self.path)
            self.weights = full_weights(trainer)


class Probe(Callback):
    """Where and how training happens: the engine's device, the parameters' devices and dtype, at the first batch."""

    def __init__(self) -> None:
        self.engine_device, self.param_devices, self.param_dtype = None, None, None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.engine_device is None:
            engine = getattr(trainer.strategy, "engine", None)
            self.engine_device = None if engine is None else str(engine.device)
            self.param_devices = sorted({p.device.type for p in module.parameters()})
            self.param_dtype = str(next(module.parameters()).dtype)


def full_weights(trainer) -> dict:
    state = trainer.strategy.module_state_dict(trainer.state.wrapped)
    # fsdp's state dict holds DTensor shards (one run resumes a DeepSpeed checkpoint under fsdp)
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().float().clone() for k, v in state.items()}


def build(strategy, devices: int, batch: int, callbacks=(), precision="32-true", accumulate=1, optimizer="adamw",
          max_steps=-1):
    """The model, trainer and loaders of one run (the tests build the one-process reference with it too)."""
    model = TinyTransformer(optimizer)
    trainer = tf.Trainer(
        strategy=strategy, accelerator="cpu", devices=devices, max_epochs=EPOCHS, max_steps=max_steps,
        precision=precision,
        accumulate_grad_batches=accumulate, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, callbacks=list(callbacks),
    )
    data = make_data()
    # in order at any world size (the Trainer would shuffle the default sampler): resumed runs on other world
    # sizes must continue with the uninterrupted run's batches
    train = DataLoader(data, batch_size=batch, sampler=InOrder(data))
    val = DataLoader(TensorDataset(*data[:16]), batch_size=4)
    return model, trainer, train, val


def fleet_run(strategy: str, devices: int, batch: int, ckpt: str) -> dict:
    """A hand-written loop with Fleet: train, save at step SAVE_AT, then a fresh engine loads it and finishes."""
    fleet = tf.Fleet(strategy=strategy, accelerator="cpu", devices=devices)
    fleet.launch()

    def setup():
        net = TinyTransformer()
        return fleet.setup(net, torch.optim.AdamW(net.parameters(), lr=0.02, weight_decay=0.01))

    loader = fleet.setup_dataloaders(DataLoader(make_data(), batch_size=batch))
    out = train_save_resume(fleet, setup, loader, EPOCHS, SAVE_AT, ckpt, lambda _: full_weights_of(fleet.strategy))
    return {"weights": out["weights"], "resumed_weights": out["resumed_weights"], "extra": out["extra"],
            "world_size": fleet.world_size}


def full_weights_of(strategy) -> dict:
    return {k: v.detach().float().clone() for k, v in strategy.module_state_dict(strategy.engine).items()}


def _deepspeed_accelerator() -> str | None:
    from deepspeed.accelerator import real_accelerator

    held = real_accelerator.ds_accelerator
    return None if held is None else held.device_name()


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    devices = cfg.get("devices", 2)
    results = {}
    for run in cfg["runs"]:
        tf.seed_everything(0)
        if run.get("fleet"):
            results[run["name"]] = fleet_run(run["strategy"], devices, cfg.get("batch", BATCH),
                                             os.path.join(run["ckpt_dir"], f"{run['name']}.ckpt"))
            continue
        if run.get("ds_accelerator") == "cuda":
            from deepspeed.accelerator import set_accelerator
            from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

            set_accelerator(CUDA_Accelerator())
        before = _deepspeed_accelerator()
        saver = None
        probe = Probe()
        callbacks = [probe]
        if run.get("save_at"):
            saver = SaveAt(run["save_at"], os.path.join(run["ckpt_dir"], f"{run['name']}.ckpt"))
            callbacks.append(saver)
        model, trainer, train, val = build(run["strategy"], devices, cfg.get("batch", BATCH), callbacks,
                                           run.get("precision", "32-true"), run.get("accumulate", 1),
                                           run.get("optimizer", "adamw"), run.get("max_steps", -1))
        if run.get("validate"):
            model, trainer, _, val = build(run["strategy"], devices, cfg.get("batch", BATCH))
            metrics = trainer.validate(model, val, ckpt_path=run["validate"], verbose=False)
            results[run["name"]] = {"weights": full_weights(trainer), "val_loss": metrics[0]["val_loss"]}
            continue
        if run.get("expect_error"):
            try:
                trainer.fit(model, train, val, ckpt_path=run.get("resume"))
                results[run["name"]] = {"error": None}
            except Exception as exc:  # every rank fails the same way, before any collective
                results[run["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        trainer.fit(model, train, val, ckpt_path=run.get("resume"))
        results[run["name"]] = {
            "weights": full_weights(trainer),
            "saved_weights": saver.weights if saver is not None else None,
            "global_step": trainer.global_step,
            "batches_run": model.batches_run,
            "world_size": trainer.world_size,
            "stage": getattr(trainer.strategy, "zero_stage", None),
            "param_dtype": probe.param_dtype,
            "config": getattr(trainer.strategy, "config", None),
            # a run stopped by max_steps before an epoch's end has not validated
            "val_loss": float(trainer.callback_metrics.get("val_loss", float("nan"))),
            "ds_accelerator_before": before,
            "ds_accelerator": _deepspeed_accelerator(),
            "engine_device": probe.engine_device,
            "param_devices": probe.param_devices,
        }
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        torch.save(results, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
