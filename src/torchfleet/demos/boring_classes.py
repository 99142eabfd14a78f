"""Lightning's ``boring_classes``: the smallest complete Module and its random data, for trying a feature or
reporting a bug, with Lightning's names, signatures and data (the same seed draws the same numbers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from torchfleet.data import DataModule
from torchfleet.module import Module
from torchfleet.utilities.types import STEP_OUTPUT


class RandomDataset(Dataset):
    """``length`` random vectors of ``size`` features, drawn once from torch's generator."""

    def __init__(self, size: int, length: int) -> None:
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return self.len


class RandomDictDataset(RandomDataset):
    """RandomDataset whose items are ``{"a": x, "b": x + 2}``."""

    def __getitem__(self, index: int) -> dict[str, Tensor]:  # type: ignore[override]
        a = self.data[index]
        return {"a": a, "b": a + 2}


class RandomIterableDataset(IterableDataset):
    """``count`` random vectors of ``size`` features, drawn as they are read (no length)."""

    def __init__(self, size: int, count: int) -> None:
        self.count, self.size = count, size

    def __iter__(self) -> Iterator[Tensor]:
        for _ in range(self.count):
            yield torch.randn(self.size)


class RandomIterableDatasetWithLen(RandomIterableDataset):
    """RandomIterableDataset with a length."""

    def __len__(self) -> int:
        return self.count


class BoringModel(Module):
    """One Linear(32, 2) layer driven towards outputs of one (MSE), SGD(lr=0.1) with a StepLR; every stage defined.

    Subclass it and override one method to try something; each data method gives 64 random vectors, one a batch.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)

    def loss(self, preds: Tensor, labels: Tensor | None = None) -> Tensor:
        return F.mse_loss(preds, torch.ones_like(preds) if labels is None else labels)

    def step(self, batch: Any) -> Tensor:
        return self.loss(self(batch))

    def training_step(self, batch: Any, batch_idx: int) -> STEP_OUTPUT:
        return {"loss": self.step(batch)}

    def validation_step(self, batch: Any, batch_idx: int) -> STEP_OUTPUT:
        return {"x": self.step(batch)}

    def test_step(self, batch: Any, batch_idx: int) -> STEP_OUTPUT:
        return {"y": self.step(batch)}

    def configure_optimizers(self) -> tuple[list[torch.optim.Optimizer], list[torch.optim.lr_scheduler.LRScheduler]]:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def test_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))


class ManualOptimBoringModel(BoringModel):
    """BoringModel with manual optimisation: the optimizer handle is an instance of the optimizer's class."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> STEP_OUTPUT:
        opt = self.optimizers()
        assert isinstance(opt, torch.optim.Optimizer)
        loss = self.step(batch)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


class _RandomStages(DataModule):
    """Loaders of one sample a batch over ``random_train``, ``random_val``, ``random_test``, ``random_predict``."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.random_train)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.random_val)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.random_test)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.random_predict)


class BoringDataModule(_RandomStages):
    """256 random vectors of 32 features (drawn when created), split into four 64-vector stages, one a batch."""

    def __init__(self) -> None:
        super().__init__()
        self.random_full = RandomDataset(32, 64 * 4)

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.random_train = Subset(self.random_full, indices=range(64))
        if stage in ("fit", "validate"):
            self.random_val = Subset(self.random_full, indices=range(64, 64 * 2))
        if stage == "test":
            self.random_test = Subset(self.random_full, indices=range(64 * 2, 64 * 3))
        if stage == "predict":
            self.random_predict = Subset(self.random_full, indices=range(64 * 3, 64 * 4))


class BoringDataModuleNoLen(_RandomStages):
    """Iterable random data without a length: 512 training, 128 validation, 256 test and 64 predict vectors."""

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.random_train = RandomIterableDataset(32, 512)
        if stage in ("fit", "validate"):
            self.random_val = RandomIterableDataset(32, 128)
        if stage == "test":
            self.random_test = RandomIterableDataset(32, 256)
        if stage == "predict":
            self.random_predict = RandomIterableDataset(32, 64)


class IterableBoringDataModule(DataModule):
    """Two loaders a stage, one map-style and one iterable (4 features): training combines them, evaluation reads
    them one after the other."""

    def setup(self, stage: str) -> None:
        sizes = {"fit": ("train", 16), "test": ("test", 64), "predict": ("predict", 128)}
        if stage in sizes:
            name, n = sizes[stage]
            setattr(self, f"{name}_datasets", [RandomDataset(4, n), RandomIterableDataset(4, n)])
        if stage in ("fit", "validate"):
            self.val_datasets = [RandomDataset(4, 32), RandomIterableDataset(4, 32)]

    def train_dataloader(self) -> list[DataLoader]:
        return [DataLoader(d) for d in self.train_datasets]

    def val_dataloader(self) -> list[DataLoader]:
        return [DataLoader(d) for d in self.val_datasets]

    def test_dataloader(self) -> list[DataLoader]:
        return [DataLoader(d) for d in self.test_datasets]

    def predict_dataloader(self) -> list[DataLoader]:
        return [DataLoader(d) for d in self.predict_datasets]


class DemoModel(Module):
    """Linear(32, out_dim) with a ReLU; the training loss is the sum of the outputs; Adam(learning_rate)."""

    def __init__(self, out_dim: int = 10, learning_rate: float = 0.02) -> None:
        super().__init__()
        self.l1 = nn.Linear(32, out_dim)
        self.learning_rate = learning_rate

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.l1(x.view(x.size(0), -1)))

    def training_step(self, batch: Any, batch_nb: int) -> STEP_OUTPUT:
        return self(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)


class Net(nn.Module):
    """The MNIST convolutional network of PyTorch's examples (two convolutions, dropout, two linear layers);
    returns log-probabilities of the ten classes for ``[batch, 1, 28, 28]`` images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)
