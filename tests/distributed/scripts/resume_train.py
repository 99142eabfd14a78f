"""Uninterrupted runs and runs resumed from their own checkpoints, in one launch, driven by a JSON argument.

For every entry of ``cfg["cases"]``: train from scratch with shuffled, uneven data (70 samples divide by none
of 2, 3 and 4 ranks) and dropout, writing ``trainer.save_checkpoint`` right after the optimizer steps in
``save_at`` (mid-epoch, or the last step of an epoch) and at the ends of the epochs in ``save_epoch_end``;
then, for each of those checkpoints, build a fresh model from another seed and resume it to the end.
Options per case: ``name``, ``strategy`` (a name) or ``ddp`` (DDPStrategy keyword arguments),
``accumulate``, ``plain`` (also train once without saving), ``comm_hook`` (a counting all-reduce hook),
``fleet`` (a hand-written Fleet loop instead: saves at ``save_at[0]``, resumes in a fresh model).

Rank 0 writes ``cfg["out"]``: per case the uninterrupted run's full weights, global step, batches trained,
DDP's bucket layouts (parameter names per bucket) when training starts and ends, the batches trained when
each checkpoint was written, and per checkpoint the resumed run's full weights, global step, batches trained
and bucket layouts.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf
from torchfleet.callbacks import Callback

try:
    from tests.distributed.scripts.ddp_train import CommCounter, counting_allreduce
    from tests.distributed.scripts.fleet_resume import train_save_resume
except ImportError:  # run as a script from its folder
    from ddp_train import CommCounter, counting_allreduce  # type: ignore[no-redef]
    from fleet_resume import train_save_resume  # type: ignore[no-redef]

#: 70 samples, 4 a batch: 35 per rank on 2 ranks, 24 on 3 (padded), 18 on 4 (the last batch holds 2)
N_SAMPLES, BATCH, EPOCHS = 70, 4, 3


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(N_SAMPLES, 8, generator=g)
    return TensorDataset(x, torch.sin(x).sum(1, keepdim=True))


class Net(tf.Module):
    """An MLP with dropout (a resumed run must restore the RNG) and parameters of several sizes."""

    def __init__(self, seed: int, dropout: float = 0.2) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(dropout), nn.Linear(32, 32), nn.Tanh(),
                                 nn.Linear(32, 1))
        self.batches = 0

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        self.batches += 1
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class SaveAt(Callback):
    """``trainer.save_checkpoint`` right after the optimizer steps in ``steps`` and at the ends of ``epochs``."""

    def __init__(self, folder: str, steps: list[int], epochs: list[int]) -> None:
        self.folder, self.steps, self.epochs, self.paths = folder, set(steps), set(epochs), {}
        #: per checkpoint, how many batches had been trained when it was written
        self.batches: dict[str, int] = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step in self.steps and f"step-{step}" not in self.paths:  # not again after a batch that only accumulates
            self._save(trainer, module, f"step-{step}")

    def on_train_epoch_end(self, trainer, module):
        if trainer.current_epoch in self.epochs:
            self._save(trainer, module, f"epoch-{trainer.current_epoch}")

    def _save(self, trainer, module, name: str) -> None:
        self.paths[name] = os.path.join(self.folder, f"{name}.ckpt")
        self.batches[name] = module.batches
        trainer.save_checkpoint(self.paths[name])


class BucketLayout(Callback):
    """DDP's gradient buckets (parameter names, in bucket order) when training starts and when it ends."""

    def __init__(self) -> None:
        self.layouts: list[list[list[str]]] = []

    def on_train_start(self, trainer, module):
        self._record(trainer)

    def on_train_end(self, trainer, module):
        self._record(trainer)

    def _record(self, trainer) -> None:
        ddp = trainer.strategy.model
        if not hasattr(ddp, "reducer"):
            return
        names = {id(p): name.removeprefix("module.") for name, p in ddp.module.named_parameters()}
        buckets = ddp.reducer._get_zeros_like_grad_buckets()
        self.layouts.append([[names[id(p)] for p in bucket.parameters()] for bucket in buckets])


def full_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights on every rank, sharded (fsdp keeps its shards after fit) or not."""
    return {k.removeprefix("_forward_module."): (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in module.state_dict().items()}


def make_strategy(case: dict, counter: CommCounter):
    if "ddp" not in case and not case.get("comm_hook"):
        return case.get("strategy", "ddp")
    from torchfleet.strategies import DDPStrategy

    hook = {"ddp_comm_hook": counting_allreduce, "ddp_comm_state": counter} if case.get("comm_hook") else {}
    return DDPStrategy(**case.get("ddp", {}), **hook)


def fit(case: dict, devices: int, seed: int, callbacks=(), ckpt_path: str | None = None) -> dict:
    tf.seed_everything(0, verbose=False)  # the program's seed, the same in both runs (the sampler's shuffle)
    model = Net(seed)
    layout, counter = BucketLayout(), CommCounter()
    trainer = tf.Trainer(
        strategy=make_strategy(case, counter), accelerator="cpu", devices=devices, max_epochs=EPOCHS,
        accumulate_grad_batches=case.get("accumulate", 1), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[*callbacks, layout],
    )
    trainer.fit(model, DataLoader(make_data(), batch_size=BATCH, shuffle=True), ckpt_path=ckpt_path)
    return {"weights": full_weights(model), "global_step": trainer.global_step, "batches": model.batches,
            "layouts": layout.layouts, "hook_calls": counter.calls}


def fleet_case(case: dict, devices: int, folder: str) -> dict:
    """A Fleet loop (no dropout: this loop saves no RNG state) that saves mid-run and resumes in a fresh model."""
    tf.seed_everything(0, verbose=False)
    fleet = tf.Fleet(strategy=case.get("strategy", "ddp"), accelerator="cpu", devices=devices)
    fleet.launch()
    seeds = iter((0, 123))

    def setup():
        net = Net(next(seeds), dropout=0.0)
        return fleet.setup(net, torch.optim.AdamW(net.parameters(), lr=0.01))

    loader = fleet.setup_dataloaders(DataLoader(make_data(), batch_size=BATCH, shuffle=True))
    ckpt = os.path.join(folder, "fleet.ckpt")
    out = train_save_resume(fleet, setup, loader, EPOCHS, case["save_at"][0], ckpt, full_weights)
    return {"weights": out["weights"], "resumed": {f"step-{out['extra']['step']}": {"weights": out["resumed_weights"]}}}


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    devices, results = cfg["devices"], {}
    for case in cfg["cases"]:
        folder = os.path.join(cfg["root"], case["name"])
        if case.get("fleet"):
            results[case["name"]] = fleet_case(case, devices, folder)
            continue
        saver = SaveAt(folder, case.get("save_at", []), case.get("save_epoch_end", []))
        result = {**fit(case, devices, 0, [saver]), "batches_at_save": saver.batches}
        if case.get("plain"):
            result["plain"] = fit(case, devices, 0)
        result["resumed"] = {name: fit(case, devices, 123, ckpt_path=path) for name, path in saver.paths.items()}
        results[case["name"]] = result
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        torch.save(results, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
