"""The dataset indices of each predicted batch, for prediction writers (``trainer.predict_loop.current_batch_indices``,
``epoch_batch_indices``, ``predictions``), recorded only when a callback asks for them.

A callback asks by having ``interval`` with ``on_batch``/``on_epoch`` (BasePredictionWriter's), so the loops need not
know its class. The indices come from the loader's batch sampler, which is wrapped to remember what it yields: the
loader is rebuilt around the wrapper, as Lightning's predict loop does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from torchfleet.samplers import _rebuild


class _RecordingBatchSampler:
    """A batch sampler that yields its inner one's batches and keeps them, for the pass in progress."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen: list[list[int]] = []
        self.batch_size = getattr(inner, "batch_size", None)
        self.drop_last = getattr(inner, "drop_last", False)
        self.sampler = getattr(inner, "sampler", None)

    def __iter__(self) -> Iterator[list[int]]:
        self.seen = []
        for batch in self.inner:
            self.seen.append(list(batch))
            yield batch

    def __len__(self) -> int:
        return len(self.inner)


class PredictionIndices:
    """What the predict loop records for the writers: built by :func:`prepare`, told of each batch by the loop."""

    def __init__(self, trainer: Any, loop: Any, samplers: list[Any], on_batch: bool, on_epoch: bool) -> None:
        self.trainer, self.loop, self.samplers = trainer, loop, samplers
        self.on_batch, self.on_epoch = on_batch, on_epoch
        loop.current_batch_indices = []
        loop.epoch_batch_indices = [[] for _ in samplers]

    def after_step(self, dataloader_idx: int, batch_idx: int) -> None:
        """The batch ``batch_idx`` of loader ``dataloader_idx`` was predicted: its indices, before the batch-end hooks."""
        sampler = self.samplers[dataloader_idx]
        if sampler is None or batch_idx >= len(sampler.seen):
            return  # not a DataLoader with a batch sampler: Lightning has no indices there either
        indices = sampler.seen[batch_idx]
        if self.on_epoch:
            self.loop.epoch_batch_indices[dataloader_idx].append(indices)
        if self.on_batch:
            self.loop.current_batch_indices = indices

    def finish(self, return_predictions: bool) -> None:
        """After the stage: as Lightning, the epoch's indices go, the predictions stay only when they are returned."""
        self.loop.epoch_batch_indices = []
        if not return_predictions:
            self.loop.set_predictions([])


def prepare(trainer: Any, loop: Any, loaders: list[Any]) -> tuple[list[Any], PredictionIndices | None]:
    """The predict loaders to run (rebuilt around a recording batch sampler where a writer needs indices) and the
    recorder, or the loaders as given and None when no callback writes predictions."""
    wanted = [getattr(cb, "interval", None) for cb in trainer.callbacks]
    on_batch = any(getattr(i, "on_batch", False) for i in wanted)
    on_epoch = any(getattr(i, "on_epoch", False) for i in wanted)
    if not (on_batch or on_epoch):
        return loaders, None
    rebuilt, samplers = [], []
    for loader in loaders:
        if isinstance(loader, DataLoader) and loader.batch_sampler is not None:
            recording = _RecordingBatchSampler(loader.batch_sampler)
            loader = _rebuild(loader, batch_sampler=recording)
            samplers.append(recording)
        else:
            samplers.append(None)
        rebuilt.append(loader)
    return rebuilt, PredictionIndices(trainer, loop, samplers, on_batch, on_epoch)
