"""The training batches each rank sees, under ddp on 2 CPU processes, with a ``shuffle=False`` loader.

    python shuffle_order.py (torchfleet|lightning) (trainer|fleet|trainer,fleet) OUT_DIR

Written as a Lightning program is, so that the same file runs under Lightning (``lightning``: its Trainer or
Fabric) and, by its imports alone, under torchfleet. Every rank writes ``OUT_DIR/rank<k>.json``: the sample
indices of each training batch, per epoch. ``trainer,fleet``: one launch runs the Trainer, then the Fleet (Fabric)
loop in the same processes, and writes ``OUT_DIR/<api>/rank<k>.json``.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

SEED, EPOCHS, SAMPLES, BATCH = 123, 3, 20, 3


def data() -> DataLoader:
    # the sample index is the input, so a batch says which samples it holds
    return DataLoader(TensorDataset(torch.arange(SAMPLES, dtype=torch.float32).unsqueeze(1)), batch_size=BATCH,
                      shuffle=False)


def run_trainer(pl, base: type) -> tuple[int, list]:
    class Recorder(base):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[list[list[int]]] = []

        def training_step(self, batch, batch_idx):
            if batch_idx == 0:
                self.seen.append([])
            self.seen[-1].append([int(v) for v in batch[0].flatten()])
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    pl.seed_everything(SEED)
    model = Recorder()
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=EPOCHS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, data())
    return trainer.global_rank, model.seen


def run_fleet(fleet_class: type) -> tuple[int, list]:
    fleet = fleet_class(strategy="ddp", accelerator="cpu", devices=2)
    fleet.launch()
    fleet.seed_everything(SEED)
    loader = fleet.setup_dataloaders(data())
    seen = []
    for epoch in range(EPOCHS):
        loader.sampler.set_epoch(epoch)
        seen.append([[int(v) for v in batch[0].flatten()] for batch in loader])
    return fleet.global_rank, seen


def main(library: str, api: str, out: str) -> None:
    if library == "lightning":
        import lightning.pytorch as pl
        from lightning.fabric import Fabric as Fleet

        base = pl.LightningModule
    else:
        import torchfleet as pl
        from torchfleet import Fleet

        base = pl.Module
    apis = api.split(",")
    for name in apis:
        rank, seen = run_trainer(pl, base) if name == "trainer" else run_fleet(Fleet)
        folder = os.path.join(out, name) if len(apis) > 1 else out
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
            json.dump(seen, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
