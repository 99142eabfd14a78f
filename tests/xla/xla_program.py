"""One training run for tests/xla, in a process of its own (XLA's device count is fixed when its runtime starts).

python tests/xla/xla_program.py '<json>' with keys: strategy ("spmd", "launch", "ddp", "single_device"), devices,
steps, precision, resume (a checkpoint to start from), save (where to write the final checkpoint), out (a .pt file
that receives the final weights, the logged metrics and the checkpoint's tensor devices).
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchfleet import Callback, Module, Trainer, seed_everything

BATCH = 8
SAMPLES = 64


class Regression(Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(SAMPLES, 6, generator=g)
    y = (x @ torch.linspace(-1, 1, 6)).unsqueeze(1) + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    return TensorDataset(x, y)


class SaveAtEnd(Callback):
    """Write the final checkpoint inside the run (launched replicas end with the launch)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_end(self, trainer, pl_module):
        trainer.save_checkpoint(self.path)


def strategy_for(name: str):
    if name in ("spmd", "launch"):
        from torchfleet.strategies import XLAStrategy

        return "xla", XLAStrategy(mode=name)
    return "cpu", name


def main(spec: dict) -> None:
    seed_everything(3)
    model = Regression()
    accelerator, strategy = strategy_for(spec["strategy"])
    devices = spec.get("devices", 1)
    # one process sees every sample in a batch of BATCH; launched replicas (and ddp ranks) each see BATCH // n
    per_rank = BATCH if spec["strategy"] in ("spmd", "single_device") else BATCH // devices
    loader = DataLoader(data(), batch_size=per_rank, shuffle=False)
    trainer = Trainer(accelerator=accelerator, strategy=strategy, devices=devices, max_steps=spec["steps"],
                      precision=spec.get("precision", "32-true"), logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=True,
                      default_root_dir=os.path.dirname(spec["out"]),
                      callbacks=[SaveAtEnd(spec["save"])] if spec.get("save") else [])
    trainer.fit(model, loader, ckpt_path=spec.get("resume"))
    if trainer.is_global_zero:
        saved = {}
        if spec.get("save"):
            checkpoint = torch.load(spec["save"], weights_only=True)
            saved = {"devices": sorted({t.device.type for t in checkpoint["state_dict"].values()}),
                     "global_step": checkpoint["global_step"],
                     "optimizer_devices": sorted({t.device.type for s in checkpoint["optimizer_states"]
                                                  for st in s["state"].values() for t in st.values()
                                                  if isinstance(t, torch.Tensor)})}
        torch.save({"weights": {k: v.detach().cpu().float() for k, v in model.state_dict().items()},
                    "dtype": str(next(model.parameters()).dtype),
                    "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
                    "global_step": trainer.global_step, "checkpoint": saved}, spec["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
