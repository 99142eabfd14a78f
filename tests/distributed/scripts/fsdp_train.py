"""Small transformer runs under fsdp (and ddp, for the checkpoint moves), driven by a JSON argument.

One launch trains several runs in turn (ranks and process group started once; each run builds a
new Trainer). The global batch is ``GLOBAL_BATCH`` at every world size (per-rank batch =
GLOBAL_BATCH / world size), so runs on 1, 2, 3 or 4 ranks see the same batches in the same steps
and must end with the same weights. Every run is one entry of ``cfg["runs"]``:

- ``{"name", "strategy", "save_at": step, "ckpt_dir": dir}``: train from scratch; with ``save_at``
  write ``ckpt_dir/<name>.ckpt`` after that global step.
- ``"resume": path``: resume from a checkpoint (file or directory) and train to the end.
- ``"stop_at": step`` (with ``ckpt_dir``): ``max_steps=step``; after ``fit`` returns, write
  ``ckpt_dir/<name>.ckpt`` with ``trainer.save_checkpoint``.
- ``"fsdp": {...}``: FSDPStrategy keyword arguments (``auto_wrap`` true means
  ``{nn.TransformerEncoderLayer}``, ``device_mesh`` a [replicate, shard] list).
- ``"precision"``, ``"accumulate"``: the Trainer's.
- ``"empty_init": true``: create the model inside ``trainer.init_module(empty_init=True)``.
- ``"validate": path``: ``trainer.validate`` with a checkpoint's weights.
- ``"expect_error": true``: the run must fail; its entry is ``{"error": message}``.
- ``"wrong_model": true``: build a model with a wider feed-forward (shapes differ from the checkpoint).
- ``"fleet": true``: a hand-written Fleet loop that saves at ``SAVE_AT`` and resumes in a fresh model.

Rank 0 writes ``cfg["out"]`` (torch.save) with, per run: the final full weights, global step,
batches this process ran, world size, what the parameters are while fit trains (DTensor placements, local
numel).
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
    from tests.distributed.scripts import deepspeed_train
    from tests.distributed.scripts.fleet_resume import train_save_resume
except ImportError:  # run as a script from its folder
    import deepspeed_train  # type: ignore[no-redef]
    from fleet_resume import train_save_resume  # type: ignore[no-redef]

DIM, N_SAMPLES, make_data = deepspeed_train.DIM, deepspeed_train.N_SAMPLES, deepspeed_train.make_data

#: 4 steps an epoch at any world size, 2 epochs
GLOBAL_BATCH, EPOCHS = 12, 2
STEPS = EPOCHS * N_SAMPLES // GLOBAL_BATCH
#: checkpoints are written after this optimizer step (mid-epoch)
SAVE_AT = 3


class TinyTransformer(deepspeed_train.TinyTransformer):
    """The DeepSpeed tests' model with two encoder layers (each its own FSDP unit) of feed-forward width ``ff``."""

    def __init__(self, ff: int = 16) -> None:
        super().__init__()  # seeds the generator, builds the head (and one layer, replaced here)
        self.encoder = nn.Sequential(*(
            nn.TransformerEncoderLayer(DIM, nhead=2, dim_feedforward=ff, dropout=0.0, batch_first=True, bias=False)
            for _ in range(2)
        ))


def full_weights(module: nn.Module) -> dict:
    """The whole (unsharded) weights of a module, sharded or not, on every rank."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().float().clone()
            for k, v in module.state_dict().items()}


class SaveAt(Callback):
    """Writes ``trainer.save_checkpoint(path)`` once, after the optimizer step that reaches ``step``.

    With ``kill_later``, saves again to the same path two steps later, and global rank 1 is killed
    (SIGKILL) after writing part of its shard file: the first checkpoint must survive.
    """

    def __init__(self, step: int, path: str, kill_later: bool = False) -> None:
        self.step, self.path, self.weights, self.kill_later = step, path, None, kill_later

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and self.weights is None:
            trainer.save_checkpoint(self.path)
            self.weights = full_weights(module)
        elif self.kill_later and trainer.global_step == self.step + 2:
            if trainer.global_rank == 1:
                _die_while_writing()
            trainer.save_checkpoint(self.path)


class Describe(Callback):
    """What the parameters are while fit trains (``describe_params`` after each step; fit's end makes them whole)."""

    def __init__(self) -> None:
        self.params: dict | None = None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.params = describe_params(module)


def _die_while_writing() -> None:
    import signal

    from torch.distributed.checkpoint import filesystem

    def write_data(self, plan, planner):
        with open(os.path.join(self.path, "__1_0.distcp"), "wb") as f:
            f.write(b"half a shard")
            f.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    filesystem.FileSystemWriter.write_data = write_data


def make_strategy(name: str, options: dict | None):
    if not options:
        return name
    from torchfleet.strategies import FSDPStrategy

    options = dict(options)
    if options.pop("auto_wrap", False):
        options["auto_wrap_policy"] = {nn.TransformerEncoderLayer}
    if options.pop("auto_wrap_policy_conv", False):
        options["auto_wrap_policy"] = {nn.Conv2d}  # matches nothing in this model
    if options.get("activation_checkpointing_policy") is True:
        options["activation_checkpointing_policy"] = {nn.TransformerEncoderLayer}
    if "device_mesh" in options:
        options["device_mesh"] = tuple(options["device_mesh"])
    if name == "fsdp_cpu_offload":
        options["cpu_offload"] = True
    return FSDPStrategy(**options)


def build(strategy, devices: int, num_nodes: int = 1, callbacks=(), precision="32-true", accumulate=1,
          fsdp=None, empty_init=False, ff=16, accelerator="cpu", max_steps=-1):
    """The model, trainer and loaders of one run (the tests build the one-process reference with it too)."""
    trainer = tf.Trainer(
        strategy=make_strategy(strategy, fsdp), accelerator=accelerator, devices=devices, num_nodes=num_nodes,
        max_epochs=EPOCHS, max_steps=max_steps, precision=precision, accumulate_grad_batches=accumulate, logger=False,
        enable_checkpointing=any(type(c).__name__ == "ModelCheckpoint" for c in callbacks), enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=list(callbacks),
    )
    if empty_init:
        with trainer.init_module(empty_init=True):
            model = TinyTransformer(ff)
    else:
        model = TinyTransformer(ff)
    data = make_data()
    batch = GLOBAL_BATCH // (devices * num_nodes)
    # in order at any world size (the Trainer would shuffle the default sampler): resumed runs on other world
    # sizes must continue with the uninterrupted run's batches
    train = DataLoader(data, batch_size=batch, sampler=InOrder(data))
    val = DataLoader(TensorDataset(*data[:16]), batch_size=4)
    return model, trainer, train, val


def describe_params(module: nn.Module) -> dict:
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in module.named_parameters():
        out[name.removeprefix("_forward_module.")] = {  # a Fleet-wrapped module's names
            "dtensor": isinstance(p, DTensor),
            "placements": [str(x) for x in p.placements] if isinstance(p, DTensor) else None,
            "local_numel": (p.to_local() if isinstance(p, DTensor) else p).numel(),
            "numel": p.numel(),
            "device": str(p.device),
        }
    return out


def fleet_run(strategy: str, devices: int, ckpt: str, options: dict | None, accelerator: str = "cpu") -> dict:
    """Fleet: train, save at SAVE_AT; a fresh model + optimizer loads that checkpoint and finishes."""
    fleet = tf.Fleet(strategy=make_strategy(strategy, options), accelerator=accelerator, devices=devices)
    fleet.launch()

    def setup():
        net = TinyTransformer()
        # the optimizer is built before sharding, as in a plain loop; setup points it at the shards
        return fleet.setup(net, torch.optim.AdamW(net.parameters(), lr=0.02, weight_decay=0.01))

    loader = fleet.setup_dataloaders(DataLoader(make_data(), batch_size=GLOBAL_BATCH // devices))
    out = train_save_resume(fleet, setup, loader, EPOCHS, SAVE_AT, ckpt, full_weights)
    return {"weights": out["weights"], "resumed_weights": out["resumed_weights"], "extra": out["extra"],
            "world_size": fleet.world_size, "params": describe_params(out["model"])}


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    devices, num_nodes = cfg.get("devices", 2), cfg.get("num_nodes", 1)
    #: "cpu" for the gloo tests here; tests/gpu runs the same script with "cuda"
    accelerator = cfg.get("accelerator", "cpu")
    results = {}
    for run in cfg["runs"]:
        tf.seed_everything(0)
        name, strategy = run["name"], run["strategy"]
        if run.get("fleet"):
            results[name] = fleet_run(strategy, devices, os.path.join(run["ckpt_dir"], f"{name}.ckpt"),
                                      run.get("fsdp"), accelerator)
            continue
        saver = None
        describe = Describe()
        callbacks = [describe]
        if run.get("save_at"):
            saver = SaveAt(run["save_at"], os.path.join(run["ckpt_dir"], f"{name}.ckpt"),
                           kill_later=run.get("kill_in_second_save", False))
            callbacks.append(saver)
        if run.get("model_checkpoint"):
            from torchfleet.callbacks import ModelCheckpoint

            callbacks.append(ModelCheckpoint(dirpath=os.path.join(run["ckpt_dir"], name), monitor="val_loss",
                                             save_top_k=1, save_last=True))
        model, trainer, train, val = build(
            strategy, devices, num_nodes, callbacks, run.get("precision", "32-true"), run.get("accumulate", 1),
            run.get("fsdp"), run.get("empty_init", False), ff=32 if run.get("wrong_model") else 16,
            accelerator=accelerator, max_steps=run.get("stop_at", -1))
        was_meta = any(p.is_meta for p in model.parameters())
        try:
            if run.get("validate"):
                metrics = trainer.validate(model, val, ckpt_path=run["validate"], verbose=False)
                results[name] = {"weights": full_weights(model), "val_loss": metrics[0]["val_loss"]}
                continue
            trainer.fit(model, train, val, ckpt_path=run.get("resume"))
            if run.get("stop_at"):
                # fit returned at max_steps, inside an epoch; the checkpoint written now must resume there
                trainer.save_checkpoint(os.path.join(run["ckpt_dir"], f"{name}.ckpt"))
        except Exception as exc:
            if not run.get("expect_error"):
                raise
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        if run.get("expect_error"):
            results[name] = {"error": None}
            continue
        results[name] = {
            "weights": full_weights(model),
            "saved_weights": saver.weights if saver is not None else None,
            "global_step": trainer.global_step,
            "batches_run": model.batches_run,
            "world_size": trainer.world_size,
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
            "was_meta": was_meta,
            "params": describe.params,
            "val_loss": float(trainer.callback_metrics["val_loss"]),
            "best_model_path": trainer.checkpoint_callback.best_model_path if run.get("model_checkpoint") else None,
        }
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        torch.save(results, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
