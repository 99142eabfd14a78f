"""The loops' shape, agreed by every rank: how many batches an epoch has, whether an evaluation runs.

Each rank knows only its own shard. Ranks that decided alone would part ways: a rank without a
validation batch would skip the validation in whose epoch-end reductions the others wait, and a rank
with one training batch more would wait in a gradient all-reduce that nobody joins. So when a stage
starts, one collective gathers every rank's batch counts, and each rank then runs the same shape:

* training: the smallest count of any rank (the gradient synchronisation needs every rank in every
  step); where some rank's loader has no length (an IterableDataset), the ranks also agree before
  each batch that every one of them has a batch (``LookAhead``), and the epoch ends for all when
  the first runs out;
* evaluation: per dataloader the largest count of any rank. A rank with fewer batches stops early and
  still joins the epoch-end reductions, so a rank with none at all is simply a rank that ran zero
  batches (its logged means weigh nothing; the metric equals the one-process value).

One process agrees with itself at no cost: nothing here issues a collective when the world is one rank.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from torchfleet.watchdog import labelled

_END = object()


def gather_counts(strategy: Any, counts: list[float]) -> list[list[float]]:
    """Every rank's ``counts`` (one row per rank, in rank order): one collective, none in a one-rank world."""
    if strategy.world_size == 1 or not counts:
        return [list(counts)]
    mine = torch.tensor([float(c) for c in counts], dtype=torch.float64, device=strategy.root_device)
    with labelled("loop shape: every rank's batch counts"):
        table = strategy.all_gather(mine)
    return [[float(c) for c in row] for row in table.cpu().tolist()]


def _as_count(value: float) -> int | float:
    return value if math.isinf(value) else int(value)


@dataclass(frozen=True)
class FitShape:
    """What every rank of a fit runs: training batches per epoch, whether to agree per batch, validation batches."""

    train_batches: int | float
    lockstep: bool
    val_batches: list[int | float]


def agree_fit(strategy: Any, train_batches: int | float, train_sized: bool, val_batches: list[Any]) -> FitShape:
    """The fit's shape every rank runs, from each rank's own ``train_batches`` and ``val_batches`` (one per loader)."""
    table = gather_counts(strategy, [train_batches, float(train_sized), *val_batches])
    trains = [row[0] for row in table]
    lockstep = len(table) > 1 and not all(row[1] for row in table)
    agreed = min(trains)
    if len(set(trains)) > 1 and strategy.is_global_zero:
        counts = ", ".join(f"rank {r}: {'unknown' if math.isinf(n) else int(n)}" for r, n in enumerate(trains))
        warnings.warn(
            f"The ranks' training data give them different numbers of batches per epoch ({counts}). Every step "
            "synchronises the gradients of all ranks, so every rank trains "
            f"{'until the first runs out' if math.isinf(agreed) else f'{int(agreed)} batches per epoch'} and the "
            "other ranks' extra batches are left out. Let torchfleet shard the data (its distributed sampler pads the "
            "shards to equal length), or give every rank the same number of batches.",
            UserWarning,
            stacklevel=3,
        )
    vals = [_as_count(max(row[2 + i] for row in table)) for i in range(len(val_batches))]
    return FitShape(_as_count(agreed), lockstep, vals)


def val_every_fraction(n: int | float, interval: float) -> int | float:
    """Training batches between validations for a val_check_interval that is a fraction of ``n`` batches."""
    return n if math.isinf(n) or interval == 1.0 else max(1, int(n * interval))


def agree_eval(strategy: Any, batches: list[Any]) -> list[int | float]:
    """Per dataloader, the largest number of batches any rank evaluates: the count every rank's loop runs to."""
    table = gather_counts(strategy, list(batches))
    return [_as_count(max(row[i] for row in table)) for i in range(len(batches))]


def has_length(loader: Any) -> bool:
    """Whether ``len(loader)`` is known (an IterableDataset without ``__len__`` has none)."""
    try:
        len(loader)
    except TypeError:
        return False
    return True


class LookAhead:
    """``iterator``'s batches read one ahead, so that ``last`` is True while the last one is processed.

    For training data without a length (Lightning's fetcher also reads one ahead): the epoch's last batch
    then ends an accumulation window and is followed by the epoch-end validation, as with a sized loader.
    With ``strategy`` (some rank's data have no length), the ranks agree on every read, one small
    collective per batch: a batch is used only if every rank has one, so the epoch ends for all when the
    first runs out; ``uneven`` then says whether some rank still had a batch.
    """

    def __init__(self, iterator: Iterator[Any], strategy: Any = None, epoch: int = 0) -> None:
        self.iterator, self.strategy, self.epoch = iterator, strategy, epoch
        self.last = False
        self.uneven = False

    def __iter__(self) -> Iterator[Any]:
        following = self._read()
        while following is not _END:
            batch, following = following, self._read()
            self.last = following is _END
            yield batch

    def _read(self) -> Any:
        batch = next(self.iterator, _END)
        strategy = self.strategy
        if strategy is None:
            return batch
        has = torch.tensor(0.0 if batch is _END else 1.0, device=strategy.root_device)
        with labelled(f"loop shape: every rank has a training batch (epoch {self.epoch})"):
            votes = int(strategy.reduce(has, reduce_op="sum"))
        if votes < strategy.world_size:
            self.uneven = self.uneven or votes > 0
            return _END
        return batch


class _NeverLast:
    """What the fit loop reads ``last`` from when the epoch's length is known: never the last batch early."""

    __slots__ = ("last", "uneven")  # read once per batch: a slot is the cheapest attribute

    def __init__(self) -> None:
        self.last = self.uneven = False


NEVER_LAST = _NeverLast()


def no_training_warning(trainer: Any, epoch: int | None = None, uneven: bool = False) -> None:
    """On rank 0: why fit trains no further (no training batch at all), or that the ranks' data ran out unevenly."""
    if not trainer.is_global_zero:
        return
    if uneven:
        message = (
            "The ranks' training data (without a length) ran out at different batches: every rank ended the epoch "
            "when the first ran out, as every step synchronises the gradients of all ranks, and the other ranks' "
            "remaining batches were not used. Give every rank the same number of batches (shard an IterableDataset "
            "evenly) to train on all of them."
        )
    elif epoch is not None:
        message = (
            f"The training dataloader gave no batch in epoch {epoch}{' on some rank' if trainer.world_size > 1 else ''}"
            ", so fit stops: a loader without a length that is empty would be empty in every further epoch, and fit "
            "would never reach max_steps."
        )
    elif trainer.limit_train_batches == 0:
        message = "Trainer(limit_train_batches=0) leaves no training batch: fit skips training."
    else:
        message = (
            f"The training dataloader has no batches{' on any rank' if trainer.world_size > 1 else ''}: fit skips "
            "training. Give it data, or pass limit_train_batches=0 to skip training on purpose."
        )
    warnings.warn(message, UserWarning, stacklevel=3)
