"""``trainer.fit_loop``: the fit loop's counters in the shape Lightning's callbacks read them.

A view over the Trainer's RunState, built when asked for: the loop itself keeps plain counters in its hot
path and pays nothing for this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchfleet.trainer.trainer import Trainer


@dataclass(frozen=True)
class ProgressCounts:
    """How many items (epochs or batches) are ready, started, processed and completed.

    torchfleet counts an item once it is done, so the four are equal outside an item; while an epoch
    runs, ``ready`` and ``started`` count it already and ``processed``/``completed`` do not yet.
    """

    ready: int = 0
    started: int = 0
    processed: int = 0
    completed: int = 0


@dataclass(frozen=True)
class Progress:
    """``total`` counts the whole run, resumed runs included; ``current`` the same (one run, as torchfleet
    restores its counters whole)."""

    total: ProgressCounts
    current: ProgressCounts


def _counts(done: int, running: bool) -> Progress:
    counts = ProgressCounts(done + running, done + running, done, done)
    return Progress(counts, counts)


class EpochLoopProgress:
    """``trainer.fit_loop.epoch_loop``: the batches of the running (or last) epoch, and the step count."""

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer

    @property
    def batch_progress(self) -> Progress:
        """Training batches: ``current`` in this epoch, ``total`` since the run began."""
        progress = self._trainer.state.progress or {}
        in_epoch = progress.get("batches_done", 0)
        total = progress.get("batches_before", 0) + in_epoch
        counts_total = ProgressCounts(total, total, total, total)
        counts_epoch = ProgressCounts(in_epoch, in_epoch, in_epoch, in_epoch)
        return Progress(counts_total, counts_epoch)

    @property
    def global_step(self) -> int:
        return self._trainer.global_step

    @property
    def batch_idx(self) -> int:
        """Index of the last training batch done in this epoch (-1 before the first)."""
        return (self._trainer.state.progress or {}).get("batches_done", 0) - 1

    @property
    def max_steps(self) -> int:
        return self._trainer.max_steps


def _trainer_attribute(name: str, doc: str) -> property:
    return property(lambda self: getattr(self._trainer, name),
                    lambda self, value: setattr(self._trainer, name, value), doc=doc)


class FitProgress:
    """``trainer.fit_loop``: epoch progress, the epoch loop's batch progress, and the fit's limits."""

    max_epochs = _trainer_attribute("max_epochs", "Epochs fit runs at most (-1: no limit); settable.")
    min_epochs = _trainer_attribute("min_epochs", "Epochs fit runs at least; settable.")
    max_steps = _trainer_attribute("max_steps", "Optimizer steps fit takes at most (-1: no limit); settable.")
    min_steps = _trainer_attribute("min_steps", "Optimizer steps fit takes at least; settable.")

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer
        self.epoch_loop = EpochLoopProgress(trainer)

    @property
    def epoch_progress(self) -> Progress:
        """Epochs: ``completed`` is the number of whole epochs done; during an epoch it is started, not done."""
        state = self._trainer.state
        progress: dict[str, Any] = state.progress or {}
        running = state.fn == "fit" and bool(progress) and not progress.get("epoch_done", True)
        return _counts(state.current_epoch, running)

    @property
    def total_batch_idx(self) -> int:
        """Index of the last training batch done, counted across epochs (-1 before the first)."""
        return self.epoch_loop.batch_progress.total.completed - 1

    @property
    def batch_idx(self) -> int:
        return self.epoch_loop.batch_idx

    @property
    def done(self) -> bool:
        t = self._trainer
        return (t.max_steps != -1 and t.global_step >= t.max_steps) or (
            t.max_epochs != -1 and t.current_epoch >= t.max_epochs
        )
