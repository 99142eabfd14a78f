"""A program in the style of the lightning-hydra-template, runnable under torchfleet or Lightning.

Hydra's ``instantiate`` with ``_partial_: true`` hands the model ``functools.partial(torch.optim.Adam, lr=...)`` and
``functools.partial(ReduceLROnPlateau, ...)``; the model keeps them with ``save_hyperparameters(logger=False)`` and
calls them in ``configure_optimizers``. The run trains, tests the best checkpoint (``ckpt_path="best"``), resumes
from ``last`` for one more epoch, tests again, and rebuilds the best model with ``load_from_checkpoint``.

``python hydra_style_program.py torchfleet|lightning FOLDER`` prints one JSON line of what it measured. Lightning
2.6.6 under torch 2.13 refuses its own checkpoints of this program (``functools.partial`` is not an allowed global
of ``torch.load(weights_only=True)``), so its side passes ``weights_only=False``; torchfleet's passes nothing.
"""

from __future__ import annotations

import functools
import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class DenseNet(nn.Module):
    """The template's ``SimpleDenseNet``: built by Hydra from the config and given to the model as an instance."""

    def __init__(self, inputs: int = 8, hidden: int = 16, outputs: int = 3):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(inputs, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, outputs))

    def forward(self, x):
        return self.model(x)


def _data(seed: int, n: int = 192) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, :3].argmax(1) + (x[:, 3] > 1).long()) % 3)


def run(library: str, folder: str) -> dict:
    if library == "lightning":
        from lightning.pytorch import LightningModule as Module
        from lightning.pytorch import Trainer, seed_everything
        from lightning.pytorch.callbacks import ModelCheckpoint
        trusting = {"weights_only": False}
    else:
        from torchfleet import Module, Trainer, seed_everything
        from torchfleet.callbacks import ModelCheckpoint
        trusting = {}

    class LitClassifier(Module):
        def __init__(self, net: nn.Module, optimizer, scheduler, compile: bool = False):
            super().__init__()
            self.save_hyperparameters(logger=False, ignore=["net"])
            self.net = net

        def forward(self, x):
            return self.net(x)

        def _loss(self, batch):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def training_step(self, batch, batch_idx):
            loss = self._loss(batch)
            self.log("train/loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val/loss", self._loss(batch))

        def test_step(self, batch, batch_idx):
            x, y = batch
            self.log("test/loss", self._loss(batch))
            self.log("test/acc", (self(x).argmax(1) == y).float().mean())

        def configure_optimizers(self):
            optimizer = self.hparams.optimizer(params=self.trainer.model.parameters())
            if self.hparams.scheduler is None:
                return {"optimizer": optimizer}
            scheduler = self.hparams.scheduler(optimizer=optimizer)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss",
                                                             "interval": "epoch", "frequency": 1}}

    def model() -> LitClassifier:  # what hydra.utils.instantiate(cfg.model) gives with _partial_: true
        return LitClassifier(DenseNet(), functools.partial(torch.optim.Adam, lr=0.01, weight_decay=0.0),
                             functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, mode="min", factor=0.1,
                                               patience=1))

    def trainer(epochs: int) -> Trainer:
        checkpoint = ModelCheckpoint(dirpath=folder, monitor="val/loss", mode="min", save_last=True)
        return Trainer(max_epochs=epochs, accelerator="cpu", devices=1, callbacks=[checkpoint], logger=False,
                       enable_progress_bar=False, enable_model_summary=False, deterministic=True)

    loaders = {name: DataLoader(_data(seed), batch_size=32) for name, seed in (("train", 0), ("val", 1), ("test", 2))}
    seed_everything(7)
    first = trainer(3)
    first.fit(model(), loaders["train"], loaders["val"])
    best = first.checkpoint_callback.best_model_path
    tested = first.test(dataloaders=loaders["test"], ckpt_path="best", **trusting)[0]
    loaded = LitClassifier.load_from_checkpoint(best, net=DenseNet(), **trusting)
    saved = torch.load(best, weights_only=False)["state_dict"]
    loaded_equal = list(saved) == list(loaded.state_dict()) and all(
        torch.equal(saved[k], v) for k, v in loaded.state_dict().items())
    again = trainer(4)  # a new run's Trainer resuming from the last checkpoint (its top-k replaces the best file)
    again.fit(model(), loaders["train"], loaders["val"], ckpt_path=f"{folder}/last.ckpt", **trusting)
    resumed = again.test(dataloaders=loaders["test"], ckpt_path="last", **trusting)[0]
    optimizer = loaded.hparams.optimizer
    return {"best": best.rsplit("/", 1)[-1], "test": tested, "resumed": resumed, "global_step": again.global_step,
            "optimizer": [optimizer.func.__qualname__, optimizer.keywords],
            "scheduler": [loaded.hparams.scheduler.func.__qualname__, loaded.hparams.scheduler.keywords],
            "loaded_equal": loaded_equal}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2])))
