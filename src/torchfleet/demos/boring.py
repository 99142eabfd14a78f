"""BoringModel and its random data: the smallest complete Module, for trying a Trainer feature or reporting a bug."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from torchfleet.data import DataModule
from torchfleet.module import Module


class RandomDataset(Dataset):
    """``length`` random vectors of ``size`` features (drawn once, from torch's generator)."""

    def __init__(self, size: int = 32, length: int = 64) -> None:
        self.data = torch.randn(length, size)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]


class RandomIterableDataset(IterableDataset):
    """``count`` random vectors of ``size`` features, drawn as they are read."""

    def __init__(self, size: int = 32, count: int = 64) -> None:
        self.size, self.count = size, count

    def __iter__(self) -> Iterator[torch.Tensor]:
        for _ in range(self.count):
            yield torch.randn(self.size)


class BoringModel(Module):
    """One Linear(32, 2) layer trained to output ones (MSE), SGD(lr=0.1) with a StepLR; every stage defined.

    Override one method to try something; the data methods give 64 random vectors in batches of 2.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def loss(self, preds: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        return nn.functional.mse_loss(preds, torch.ones_like(preds) if target is None else target)

    def step(self, batch: torch.Tensor) -> torch.Tensor:
        return self.loss(self(batch))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> dict[str, torch.Tensor]:
        return {"loss": self.step(batch)}

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> dict[str, torch.Tensor]:
        return {"x": self.step(batch)}

    def test_step(self, batch: torch.Tensor, batch_idx: int) -> dict[str, torch.Tensor]:
        return {"y": self.step(batch)}

    def predict_step(self, batch: torch.Tensor, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1)]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64), batch_size=2)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64), batch_size=2)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64), batch_size=2)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64), batch_size=2)


class ManualOptimBoringModel(BoringModel):
    """BoringModel with manual optimisation: the optimizer handle is an instance of the optimizer's class."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> dict[str, torch.Tensor]:
        opt = self.optimizers()
        assert isinstance(opt, torch.optim.Optimizer)
        loss = self.step(batch)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return {"loss": loss}


class BoringDataModule(DataModule):
    """Random vectors of 32 features: 64 for training, validation, test and predict each (batches of 2)."""

    def setup(self, stage: str) -> None:
        self.splits = {name: RandomDataset(32, 64) for name in ("train", "val", "test", "predict")}

    def _loader(self, name: str) -> DataLoader:
        return DataLoader(self.splits[name], batch_size=2)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict")
