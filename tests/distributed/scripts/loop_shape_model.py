"""Models and data whose shards differ per rank, for the loop-shape tests (tests/distributed/test_loop_shape.py).

Importable by spawned ranks. Datasets read the rank when they are iterated or measured, in the rank's process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torchmetrics
from torch.utils.data import Dataset, IterableDataset

from tests.helpers import Regressor, make_data


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


class Evaluated(Regressor):
    """Logs the evaluation loss three ways: a synced mean, a synced sample count, a torchmetrics attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.mse = torchmetrics.MeanSquaredError()

    def _evaluate(self, batch, prefix: str) -> None:
        x, y = batch
        out = self(x)
        self.log(f"{prefix}_loss", torch.nn.functional.mse_loss(out, y), sync_dist=True)
        self.log(f"{prefix}_count", float(len(x)), reduce_fx="sum", sync_dist=True)
        self.mse(out, y)
        self.log(f"{prefix}_mse", self.mse)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")


class LocalMetric(Regressor):
    """Logs a torchmetrics Metric made inside validation_step: not an attribute another rank could find."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        metric = torchmetrics.MeanSquaredError()
        metric(self(x), y)
        self.log("val_mse", metric)


class Gathering(Regressor):
    """A collective of the user's own in every validation batch: ranks with unequal shards diverge there."""

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.all_gather(batch[0])  # GATHER-LINE


class RankStream(IterableDataset):
    """An unsharded stream without a length: rank r yields 3 + 2r samples (rank 0 runs out first)."""

    def __iter__(self):
        rank = _rank()
        data = make_data(3 + 2 * rank, seed=rank)
        return iter(zip(data.tensors[0].unsqueeze(1), data.tensors[1].unsqueeze(1)))


class RankSized(Dataset):
    """A per-rank dataset of a known length: 6 samples on rank 0, 4 on rank 1 (the user shards it)."""

    def __init__(self) -> None:
        self.data = make_data(6)

    def __len__(self) -> int:
        return 6 - 2 * _rank()

    def __getitem__(self, i: int):
        return self.data[i]
