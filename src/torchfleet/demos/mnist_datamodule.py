"""Lightning's MNIST demo names (``MNIST``, ``MNISTDataModule``) over a generated MNIST-shaped task: no download.

Images are 28x28, one channel, ten classes, stored as uint8 like torchvision's MNIST (``data``, ``targets``);
an item is ``(image [1, 28, 28] float in [0, 1], label int)``, as torchvision's with ``ToTensor()`` gives it.
Each class has a fixed random stroke pattern; a sample is its pattern shifted by up to two pixels, with noise.
Small models learn it in an epoch or two, as they learn MNIST.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, random_split

from torchfleet.data import DataModule
from torchfleet.module import Module

_DATASETS_PATH = "./data"


class SyntheticMNIST(Dataset):
    """``length`` samples; the same ``seed`` gives the same samples, and ``pattern_seed`` the same class patterns
    (shared by the train and test splits, so what is learnt on one holds on the other)."""

    def __init__(self, length: int = 2000, seed: int = 0, noise: float = 0.3, pattern_seed: int = 1234,
                 normalize: tuple[float, float] | None = None) -> None:
        patterns = torch.rand(10, 28, 28, generator=torch.Generator().manual_seed(pattern_seed)) > 0.8
        g = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, 10, (length,), generator=g)
        shifts = torch.randint(0, 5, (length, 2), generator=g)  # -2..2 pixels, as indices into the 5 x 5 rolls
        rolled = torch.stack([torch.stack([torch.stack([patterns[c].roll((dy - 2, dx - 2), dims=(0, 1))
                                                        for dx in range(5)]) for dy in range(5)]) for c in range(10)])
        strokes = rolled[self.targets, shifts[:, 0], shifts[:, 1]].to(torch.uint8)
        level = int(255 * noise)  # uint8 noise: a 60000-image split stays at 47 MB
        speckle = torch.randint(0, level + 1, (length, 28, 28), dtype=torch.uint8, generator=g)
        self.data = strokes * (255 - level) + speckle
        self.normalize = normalize

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.data[index].float().unsqueeze(0) / 255
        if self.normalize is not None:
            image = (image - self.normalize[0]) / self.normalize[1]
        return image, int(self.targets[index])


def MNIST(root: str = _DATASETS_PATH, train: bool = True, download: bool = True, **kwargs: Any) -> Dataset:  # noqa: N802
    """Lightning's ``MNIST(root, train=...)``: the generated training (60,000) or test (10,000) split.

    ``root`` and ``download`` are accepted and not used; ``length``, ``seed``, ``noise`` and ``normalize`` go to
    SyntheticMNIST (``transform`` is accepted and ignored: items are tensors already).
    """
    kwargs.pop("transform", None)
    kwargs.setdefault("length", 60_000 if train else 10_000)
    kwargs.setdefault("seed", 0 if train else 1)
    return SyntheticMNIST(**kwargs)


class MNISTDataModule(DataModule):
    """Lightning's MNISTDataModule over the generated MNIST: ``val_split`` training images for validation, the
    test split for test; ``normalize`` maps pixels to [-1, 1]. ``train_size``/``test_size`` (ours) shrink the
    splits; ``data_dir`` is not read."""

    name = "mnist"

    def __init__(self, data_dir: str = _DATASETS_PATH, val_split: int = 5000, num_workers: int = 0,
                 normalize: bool = False, seed: int = 42, batch_size: int = 32, *, train_size: int = 60_000,
                 test_size: int = 10_000) -> None:
        super().__init__()
        self.data_dir, self.val_split, self.num_workers = data_dir, val_split, num_workers
        self.normalize, self.seed, self.batch_size = normalize, seed, batch_size
        self.train_size, self.test_size = train_size, test_size

    @property
    def num_classes(self) -> int:
        return 10

    @property
    def default_transforms(self) -> None:
        """None: the generated items are tensors already (``normalize`` is applied by the dataset)."""
        return None

    def _split(self, train: bool) -> Dataset:
        return MNIST(self.data_dir, train=train, length=self.train_size if train else self.test_size,
                     normalize=(0.5, 0.5) if self.normalize else None)

    def prepare_data(self) -> None:
        """Nothing to download: the data are generated."""

    def setup(self, stage: str) -> None:
        full = self._split(train=True)
        self.dataset_train, self.dataset_val = random_split(
            full, [len(full) - self.val_split, self.val_split], generator=torch.Generator().manual_seed(42))

    def _loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=shuffle, num_workers=self.num_workers,
                          drop_last=True)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.dataset_train, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.dataset_val, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self._split(train=False), shuffle=False)


class MNISTClassifier(Module):
    """A small MLP over the 784 pixels; logs train_loss, val_loss/val_acc and test_acc (ours: not a Lightning name)."""

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
