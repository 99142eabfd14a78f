"""An autoencoder trained from the command line, written the way Lightning's LightningCLI examples are.

Ported from a Lightning program by its imports alone: the original reads ``from lightning.pytorch import
LightningDataModule, LightningModule``, ``from lightning.pytorch.callbacks import Callback`` and ``from
lightning.pytorch.cli import LightningCLI`` (tests/ported/test_ported_cli.py turns them back to run it under
Lightning). Run it as ``python cli_autoencoder.py fit --trainer.max_epochs=2``; ``--help`` lists the options.
"""

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset, random_split

from torchfleet import Callback
from torchfleet import DataModule as LightningDataModule
from torchfleet import Module as LightningModule
from torchfleet.cli import LightningCLI

FEATURES = 24


class ReconstructionProbe(Callback):
    """Measures how well a fixed sample is rebuilt after each training epoch (rank 0 keeps the numbers)."""

    def __init__(self, num_samples: int = 8):
        super().__init__()
        self.num_samples = num_samples
        self.errors = []

    def on_train_epoch_end(self, trainer, pl_module):
        x = trainer.datamodule.val_set[: self.num_samples][0]
        with torch.no_grad():
            self.errors.append(float(F.mse_loss(pl_module(x.to(pl_module.device)), x.to(pl_module.device))))


class LitAutoEncoder(LightningModule):
    def __init__(self, hidden_dim: int = 16, learning_rate: float = 1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(FEATURES, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 3))
        self.decoder = nn.Sequential(nn.Linear(3, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, FEATURES))

    def forward(self, x):
        return self.decoder(self.encoder(x))

    def training_step(self, batch, batch_idx):
        return self._common_step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._common_step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._common_step(batch, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx=None):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)

    def _common_step(self, batch, stage):
        x = batch[0]
        loss = F.mse_loss(self(x), x)
        self.log(f"{stage}_loss", loss, on_step=True, sync_dist=stage != "train")
        return loss


class MyDataModule(LightningDataModule):
    def __init__(self, batch_size: int = 8, size: int = 96):
        super().__init__()
        g = torch.Generator().manual_seed(42)  # the data do not depend on the run's seed
        codes = torch.randn(size + 32, 3, generator=g)
        points = torch.tanh(codes @ torch.randn(3, FEATURES, generator=g))
        dataset = TensorDataset(points[:size])
        self.train_set, self.val_set = random_split(dataset, [size - 32, 32], generator=torch.Generator().manual_seed(7))
        self.test_set = TensorDataset(points[size:])
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.batch_size)

    def predict_dataloader(self):
        return self.test_dataloader()


def cli_main(**kwargs):
    return LightningCLI(
        LitAutoEncoder,
        MyDataModule,
        seed_everything_default=1234,
        trainer_defaults={"max_epochs": 2, "callbacks": [ReconstructionProbe()]},
        save_config_kwargs={"overwrite": True},
        **kwargs,
    )


if __name__ == "__main__":
    cli_main()
