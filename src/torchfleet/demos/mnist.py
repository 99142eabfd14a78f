"""An MNIST-shaped task without the download: 28x28 one-channel images of ten classes, generated.

Each class has a fixed random stroke pattern; a sample is its class's pattern, shifted by up to two
pixels and with noise added. Small models learn it in an epoch or two, as they learn MNIST.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from torchfleet.data import DataModule
from torchfleet.module import Module


class SyntheticMNIST(Dataset):
    """``length`` samples ``(image [1, 28, 28], label)``; the same ``seed`` gives the same samples and class patterns
    (``pattern_seed``: shared by the train and test splits, so what is learnt on one holds on the other)."""

    def __init__(self, length: int = 2000, seed: int = 0, noise: float = 0.3, pattern_seed: int = 1234) -> None:
        patterns = (torch.rand(10, 28, 28, generator=torch.Generator().manual_seed(pattern_seed)) > 0.8).float()
        g = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, 10, (length,), generator=g)
        shifts = torch.randint(-2, 3, (length, 2), generator=g)
        images = torch.stack([torch.roll(patterns[int(c)], (int(dy), int(dx)), dims=(0, 1))
                              for c, (dy, dx) in zip(self.targets, shifts)])
        self.data = (images + noise * torch.randn(images.shape, generator=g)).unsqueeze(1)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index], self.targets[index]


class MNISTDataModule(DataModule):
    """SyntheticMNIST splits: ``train_size`` for training (and validation: the last tenth), ``test_size`` for test."""

    def __init__(self, batch_size: int = 32, train_size: int = 2000, test_size: int = 500) -> None:
        super().__init__()
        self.batch_size, self.train_size, self.test_size = batch_size, train_size, test_size

    def setup(self, stage: str) -> None:
        full = SyntheticMNIST(self.train_size, seed=0)
        n_val = len(full) // 10
        self.train, self.val = torch.utils.data.random_split(
            full, [len(full) - n_val, n_val], generator=torch.Generator().manual_seed(0))
        self.test = SyntheticMNIST(self.test_size, seed=1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test, batch_size=self.batch_size)


class MNISTClassifier(Module):
    """A small MLP over the 784 pixels; logs train_loss, val_loss/val_acc and test_acc."""

    def __init__(self, hidden: int = 64, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def _evaluate(self, batch: Any, prefix: str) -> None:
        x, y = batch
        logits = self(x)
        self.log(f"{prefix}_loss", nn.functional.cross_entropy(logits, y))
        self.log(f"{prefix}_acc", (logits.argmax(-1) == y).float().mean(), prog_bar=True)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
