"""BasePredictionWriter: subclass it to write predictions as they come (per batch) or once per pass (per epoch)."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Sequence
from typing import Any

from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks.base import Callback


class WriteInterval(str, enum.Enum):
    """When a prediction writer writes: after each batch, after the pass over the data, or both."""

    BATCH = "batch"
    EPOCH = "epoch"
    BATCH_AND_EPOCH = "batch_and_epoch"

    @property
    def on_batch(self) -> bool:
        return self in (WriteInterval.BATCH, WriteInterval.BATCH_AND_EPOCH)

    @property
    def on_epoch(self) -> bool:
        return self in (WriteInterval.EPOCH, WriteInterval.BATCH_AND_EPOCH)


class BasePredictionWriter(Callback):
    """Lightning's prediction writer: override ``write_on_batch_end`` and/or ``write_on_epoch_end``.

    ``write_interval`` "batch" calls ``write_on_batch_end(trainer, module, prediction, batch_indices, batch,
    batch_idx, dataloader_idx)`` after each ``predict_step``; "epoch" calls ``write_on_epoch_end(trainer, module,
    predictions, batch_indices)`` once the pass is done, with every batch's prediction (per loader when there are
    several, even under ``trainer.predict(return_predictions=False)``); "batch_and_epoch" both. ``batch_indices``
    are the dataset indices of each batch as this process drew them (its shard under ddp), so each rank can write
    its own file and the files be put back in dataset order; they are empty where the loader has no batch sampler.
    """

    def __init__(self, write_interval: str = "batch") -> None:
        try:
            self.interval = WriteInterval(write_interval)
        except ValueError:
            raise ConfigurationError(
                f"BasePredictionWriter(write_interval={write_interval!r}) is not valid: it is one of "
                f"{[i.value for i in WriteInterval]} (when the writer writes: after each predicted batch, after "
                "the whole pass, or both).") from None

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        step = getattr(module, "predict_step", None)
        if step is not None and "dataloader_iter" in _parameters(step):
            raise ConfigurationError(
                "A prediction writer cannot follow a predict_step(dataloader_iter) that draws its own batches: it "
                "needs each batch's indices. Take (batch, batch_idx) in predict_step, or remove the writer.")

    def write_on_batch_end(self, trainer: Any, module: Any, prediction: Any, batch_indices: Sequence[int] | None,
                           batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        """Write one batch's prediction (write_interval "batch" or "batch_and_epoch")."""
        raise NotImplementedError

    def write_on_epoch_end(self, trainer: Any, module: Any, predictions: Sequence[Any],
                           batch_indices: Sequence[Any]) -> None:
        """Write every prediction of the pass (write_interval "epoch" or "batch_and_epoch")."""
        raise NotImplementedError

    def on_predict_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        if self.interval.on_batch:
            self.write_on_batch_end(trainer, module, outputs, trainer.predict_loop.current_batch_indices, batch,
                                    batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer: Any, module: Any) -> None:
        if self.interval.on_epoch:
            loop = trainer.predict_loop
            self.write_on_epoch_end(trainer, module, loop.predictions, loop.epoch_batch_indices)


def _parameters(fn: Any) -> Sequence[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []
