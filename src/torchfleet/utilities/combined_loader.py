"""CombinedLoader: several dataloaders (a list, a dict or any nesting of them) read as one, in Lightning's four modes.

``CombinedLoader(iterables, mode)`` iterates ``(batch, batch_idx, dataloader_idx)``:

- ``"min_size"`` (default): one batch of every loader per step (the same collection shape), until the shortest ends;
- ``"max_size_cycle"``: until the longest ends, restarting the shorter ones (what ``fit`` does with a list or dict
  of training loaders);
- ``"max_size"``: until the longest ends, with None for the loaders that have ended;
- ``"sequential"``: each loader to its end, one after the other; ``batch`` is one loader's batch and
  ``dataloader_idx`` says whose (what evaluation does with several loaders).

The Trainer takes one as training or evaluation data (``BatchView`` is what its loops iterate); ``fit`` refuses
``"sequential"`` and ``predict`` takes only ``"sequential"``, as in Lightning.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils import _pytree

from torchfleet.errors import ConfigurationError
from torchfleet.samplers import set_sampler_epoch

MODES = ("min_size", "max_size_cycle", "max_size", "sequential")
#: how the loaders' lengths give the combined length, per mode
_LENGTH = {"min_size": min, "max_size_cycle": max, "max_size": max, "sequential": sum}


def _length(iterable: Any) -> int | float:
    try:
        return len(iterable)
    except TypeError:  # an iterable-style dataset: no length
        return math.inf


class CombinedLoader(Iterable):
    """Read several iterables as one, in ``mode`` (see the module's documentation)."""

    def __init__(self, iterables: Any, mode: str = "min_size") -> None:
        if mode not in MODES:
            raise ConfigurationError(
                f"CombinedLoader(mode={mode!r}) is not a mode: accepted are {', '.join(map(repr, MODES))}."
            )
        self._iterables = iterables
        self._flattened, self._spec = _pytree.tree_flatten(iterables)
        self._mode = mode
        self._limits: list[int | float] | None = None
        self._iterator: Iterator[tuple[Any, int, int]] | None = None

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def iterables(self) -> Any:
        """The collection of iterables, as given (or as ``flattened`` last replaced them)."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The iterables as a flat list (a nested collection's leaves, in order)."""
        return self._flattened

    @flattened.setter
    def flattened(self, flattened: list[Any]) -> None:
        if len(flattened) != len(self._flattened):
            raise ConfigurationError(
                f"CombinedLoader.flattened got {len(flattened)} iterables in place of its {len(self._flattened)}: "
                "replace them one for one."
            )
        self._iterables = _pytree.tree_unflatten(list(flattened), self._spec)
        self._flattened = list(flattened)

    @property
    def sampler(self) -> Any:
        """The iterables' samplers (None where one has none), in the shape of ``iterables``."""
        return _pytree.tree_unflatten([getattr(x, "sampler", None) for x in self._flattened], self._spec)

    @property
    def batch_sampler(self) -> Any:
        """The iterables' batch samplers (None where one has none), in the shape of ``iterables``."""
        return _pytree.tree_unflatten([getattr(x, "batch_sampler", None) for x in self._flattened], self._spec)

    @property
    def limits(self) -> list[int | float] | None:
        """At most this many batches of each iterable (None: all of them)."""
        return self._limits

    @limits.setter
    def limits(self, limits: int | float | list[int | float] | None) -> None:
        if isinstance(limits, (int, float)):
            limits = [limits] * len(self._flattened)
        elif limits is not None and len(limits) != len(self._flattened):
            raise ConfigurationError(
                f"CombinedLoader.limits got {len(limits)} limits for {len(self._flattened)} iterables: give one "
                "number for all, or one per iterable."
            )
        self._limits = None if limits is None else list(limits)

    def _lengths(self) -> list[int | float]:
        lengths = [_length(x) for x in self._flattened]
        return lengths if self._limits is None else [min(n, limit) for n, limit in zip(lengths, self._limits)]

    def __len__(self) -> int:
        """How many items one pass yields (an iterable without a length makes it unknown: TypeError)."""
        total = _LENGTH[self._mode](self._lengths()) if self._flattened else 0
        if math.isinf(total):
            raise TypeError(f"this CombinedLoader ({self._mode}) has no length: one of its iterables has none")
        return int(total)

    def __iter__(self) -> CombinedLoader:
        self._iterator = getattr(self, f"_{self._mode}")()
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self._iterator is None:
            iter(self)
        assert self._iterator is not None
        return next(self._iterator)

    def reset(self) -> None:
        """Forget the running pass (the next ``iter`` starts a new one)."""
        self._iterator = None

    # each mode: a generator of (batch, batch_idx, dataloader_idx)
    def _min_size(self) -> Iterator[tuple[Any, int, int]]:
        iterators = [iter(x) for x in self._flattened]
        index = 0
        while True:
            try:
                batches = [next(it) for it in iterators]
            except StopIteration:
                return
            yield _pytree.tree_unflatten(batches, self._spec), index, 0
            index += 1

    def _max_size_cycle(self) -> Iterator[tuple[Any, int, int]]:
        iterators = [iter(x) for x in self._flattened]
        ended = [False] * len(iterators)
        index = 0
        while True:
            batches = []
            for i, it in enumerate(iterators):
                try:
                    batches.append(next(it))
                except StopIteration:
                    ended[i] = True
                    if all(ended):
                        return
                    iterators[i] = iter(self._flattened[i])  # start this one again
                    batches.append(next(iterators[i]))
            yield _pytree.tree_unflatten(batches, self._spec), index, 0
            index += 1

    def _max_size(self) -> Iterator[tuple[Any, int, int]]:
        iterators: list[Iterator[Any] | None] = [iter(x) for x in self._flattened]
        index = 0
        while True:
            batches = []
            for i, it in enumerate(iterators):
                batch = None if it is None else next(it, StopIteration)
                if batch is StopIteration:
                    iterators[i], batch = None, None
                batches.append(batch)
            if all(it is None for it in iterators):
                return
            yield _pytree.tree_unflatten(batches, self._spec), index, 0
            index += 1

    def _sequential(self) -> Iterator[tuple[Any, int, int]]:
        limits = self._limits or [math.inf] * len(self._flattened)
        for loader_idx, (iterable, limit) in enumerate(zip(self._flattened, limits)):
            if limit <= 0:
                continue
            for batch_idx, batch in enumerate(iterable):  # one loader's iterator (and workers) at a time
                yield batch, batch_idx, loader_idx
                if batch_idx + 1 >= limit:
                    break


class _EpochSetter:
    """The ``sampler`` a BatchView shows its loop: ``set_epoch`` reaches every loader's samplers that have one."""

    def __init__(self, loaders: list[Any]) -> None:
        self.loaders = loaders

    def set_epoch(self, epoch: int) -> None:
        for loader in self.loaders:  # each loader's sampler and batch sampler's sampler, as Lightning's fit loop
            set_sampler_epoch(loader, epoch)


class BatchView:
    """What the Trainer's loops iterate for a CombinedLoader that combines batches (not ``"sequential"``): the
    combined batches alone, the combined length, and a ``sampler`` whose ``set_epoch`` reaches every loader's."""

    def __init__(self, combined: CombinedLoader) -> None:
        self.combined = combined

    def __iter__(self) -> Iterator[Any]:
        batches = (batch for batch, _, _ in iter(self.combined))
        try:
            length = len(self.combined)
        except TypeError:
            return batches
        # as Lightning: a known length is not read past ("max_size_cycle" would restart a loader, drawing seeds)
        return itertools.islice(batches, length)

    def __len__(self) -> int:
        return len(self.combined)

    @property
    def sampler(self) -> _EpochSetter:
        return _EpochSetter(self.combined.flattened)


__all__ = ["CombinedLoader"]
