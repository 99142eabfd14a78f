"""Small models and data shared by the tests."""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

from torchfleet import DataModule, Module


def make_data(n: int = 64, d_in: int = 8, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    w = torch.randn(d_in, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def loader(n: int = 64, batch_size: int = 8, shuffle: bool = False, seed: int = 0) -> DataLoader:
    return DataLoader(make_data(n, seed=seed), batch_size=batch_size, shuffle=shuffle)


class Regressor(Module):
    """A 2-layer MLP regressor with dropout (so RNG state matters for exact resume)."""

    def __init__(self, d_in: int = 8, hidden: int = 16, lr: float = 0.05, dropout: float = 0.0, scheduler: str | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0])

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        if self.hparams.scheduler == "step":
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 3, 0.5), "interval": "step"}}
        if self.hparams.scheduler == "epoch":
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)]
        return opt


class RegressionData(DataModule):
    def __init__(self, n: int = 64, batch_size: int = 8, shuffle: bool = True):
        super().__init__()
        self.n, self.batch_size, self.shuffle = n, batch_size, shuffle

    def setup(self, stage):
        self.train = make_data(self.n, seed=0)
        self.val = make_data(self.n // 2, seed=1)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=self.shuffle)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)


def quiet(**kw):
    """Trainer kwargs for unit tests: on the CPU (their references are computed there), small output, no files.

    GPU runs of the same behaviours live in tests/gpu.
    """
    base = dict(accelerator="cpu", enable_progress_bar=False, enable_model_summary=False, logger=False, enable_checkpointing=False,
                num_sanity_val_steps=0)
    base.update(kw)
    return base


class LogRecords(logging.Handler):
    """``with LogRecords() as messages:`` collects the messages of the "torchfleet" logger at INFO and above."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        logger = logging.getLogger("torchfleet")
        self._old_level = logger.level
        logger.addHandler(self)
        logger.setLevel(logging.INFO)
        return self.messages

    def __exit__(self, *exc):
        logger = logging.getLogger("torchfleet")
        logger.removeHandler(self)
        logger.setLevel(self._old_level)


class EpochSampler(Sampler):
    """Reads in order (not a SequentialSampler), records the epochs it is told (``epochs``)."""

    def __init__(self, n):
        self.n, self.epochs = n, []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


class FailsAt(Regressor):
    """A Regressor whose training_step raises RuntimeError("bad batch") at global step ``step``."""

    def __init__(self, step):
        super().__init__()
        self.fail_step = step

    def training_step(self, batch, batch_idx):
        if self.global_step == self.fail_step:
            raise RuntimeError("bad batch")
        return super().training_step(batch, batch_idx)
