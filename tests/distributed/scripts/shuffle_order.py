"""The training batches each rank sees, under ddp on 2 CPU processes: the Trainer's and a Fabric-style loop's.

    python shuffle_order.py (torchfleet|lightning) (trainer|fleet|trainer,fleet) OUT_DIR

Written as a Lightning program is, so that the same file runs under Lightning (``lightning``: its Trainer or
Fabric) and, by its imports alone, under torchfleet. ``trainer,fleet``: one launch runs the Trainer, then the Fleet
(Fabric) loops in the same processes. Every rank writes ``OUT_DIR/<name>/rank<k>.json``: ``trainer`` and ``fleet``,
the sample indices of each training batch per epoch of a ``shuffle=False`` loader; ``fleet_shuffled``, a
two-optimizer program over a ``shuffle=True`` loader that never calls ``set_epoch`` (its batches, losses, weights);
``fleet_samplers``, the epochs a user's sampler heard through ``sampler=`` and ``batch_sampler=``, and what each
rank read.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler, TensorDataset

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


class EpochSampler(Sampler):
    """A user's sampler whose order is the epoch it was told (rotated by it); records what it hears."""

    def __init__(self, n: int) -> None:
        self.n, self.heard = n, []

    def set_epoch(self, epoch: int) -> None:
        self.heard.append(epoch)

    def __iter__(self):
        shift = self.heard[-1] if self.heard else 0
        return iter([(i + shift) % self.n for i in range(self.n)])

    def __len__(self) -> int:
        return self.n


def two_optimizers(fleet) -> dict:
    """A GAN-shaped program with two optimizers over a shuffled loader that never calls set_epoch itself."""
    g = torch.Generator().manual_seed(5)
    dataset = TensorDataset(torch.arange(SAMPLES, dtype=torch.float32), torch.randn(SAMPLES, 2, generator=g))
    gen, disc = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    gen, opt_g = fleet.setup(gen, torch.optim.SGD(gen.parameters(), lr=0.1))
    disc, opt_d = fleet.setup(disc, torch.optim.SGD(disc.parameters(), lr=0.1))
    loader = fleet.setup_dataloaders(DataLoader(dataset, batch_size=BATCH, shuffle=True))
    batches, losses = [], []
    for _ in range(EPOCHS):
        batches.append([])
        for idx, x in loader:
            batches[-1].append([int(v) for v in idx])
            both = torch.cat([x, gen(x).detach()])
            target = torch.cat([torch.ones(len(x), 1), torch.zeros(len(x), 1)])
            loss_d = (disc(both) - target).pow(2).mean()
            opt_d.zero_grad()
            fleet.backward(loss_d)
            opt_d.step()
            loss_g = (disc(gen(x)) - 1).pow(2).mean()
            opt_g.zero_grad()
            fleet.backward(loss_g)
            opt_g.step()
            losses.append([loss_d.item(), loss_g.item()])
    weights = {f"{name}.{k}": v.tolist() for name, m in (("gen", gen), ("disc", disc))
               for k, v in m.state_dict().items()}
    return {"batches": batches, "losses": losses, "weights": weights}


def user_samplers(fleet) -> dict:
    """The epochs a user's sampler hears through a loader's ``sampler`` and its ``batch_sampler``'s sampler."""
    dataset = TensorDataset(torch.arange(SAMPLES, dtype=torch.float32))
    out = {}
    for kind in ("sampler", "batch_sampler"):
        sampler = EpochSampler(SAMPLES)
        if kind == "sampler":
            loader = DataLoader(dataset, sampler=sampler, batch_size=BATCH)
        else:
            loader = DataLoader(dataset, batch_sampler=BatchSampler(sampler, BATCH, drop_last=False))
        loader = fleet.setup_dataloaders(loader)
        seen = [[int(v) for batch in loader for v in batch[0].reshape(-1)] for _ in range(EPOCHS)]
        out[kind] = {"heard": sampler.heard, "seen": seen}
    return out


def run_fleet(fleet_class: type) -> tuple[int, dict]:
    fleet = fleet_class(strategy="ddp", accelerator="cpu", devices=2)
    fleet.launch()
    fleet.seed_everything(SEED)
    loader = fleet.setup_dataloaders(data())
    seen = []
    for epoch in range(EPOCHS):
        loader.sampler.set_epoch(epoch)
        seen.append([[int(v) for v in batch[0].flatten()] for batch in loader])
    fleet.seed_everything(SEED)
    return fleet.global_rank, {"fleet": seen, "fleet_shuffled": two_optimizers(fleet),
                               "fleet_samplers": user_samplers(fleet)}


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
        if name == "trainer":
            rank, results = run_trainer(pl, base)
            results = {"trainer": results}
        else:
            rank, results = run_fleet(Fleet)
        for key, seen in results.items():
            folder = os.path.join(out, key)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
                json.dump(seen, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
