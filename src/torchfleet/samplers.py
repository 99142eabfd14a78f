"""Adapting a user's DataLoader for distributed training: one shard of the dataset per process.

``inject_distributed_sampler`` is what parallel strategies call from ``process_dataloader``. It
replaces the default sampler of a map-style DataLoader (the one ``shuffle=False/True`` chose) by a
sampler that gives each rank its own part of the data:

* training ("fit"): a ``torch.utils.data.DistributedSampler``, shuffled iff the user shuffled,
  seeded alike on every rank so the shards are disjoint; the fit loop calls ``set_epoch``.
* evaluation ("validate", "test", "predict"): an ``ExactDistributedSampler``, which sees every
  sample exactly once over all ranks (no padding), in a fixed order.

Loaders it cannot or should not touch (one process, an IterableDataset, a sampler the user chose)
come back unchanged. Nothing here keeps state between calls.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Iterator, Sized
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from torchfleet.errors import ConfigurationError, unknown_name

log = logging.getLogger(__name__)

STAGES = ("fit", "validate", "test", "predict")

# The DataLoader settings carried over to the rebuilt loader, read from the attributes of the same name.
# (``shuffle``, ``sampler`` and ``batch_sampler`` are decided here; ``in_order`` only exists in newer torch.)
_SETTINGS = (
    "batch_size", "drop_last", "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
    "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers", "pin_memory_device",
    "in_order",
)
# Settings with plain values: when a subclass does not take one as an argument, the rebuilt loader must
# still end up with the user's value, or settings would be lost silently.
_PLAIN_SETTINGS = frozenset(_SETTINGS) - {"collate_fn", "worker_init_fn", "multiprocessing_context", "generator"}


class ExactDistributedSampler(Sampler[int]):
    """Rank ``rank`` of ``num_replicas`` takes indices ``rank, rank + num_replicas, ...`` of ``dataset``.

    Over all ranks every index appears exactly once: nothing is padded, repeated or dropped, so
    evaluation metrics are computed over the dataset itself. Ranks differ in length by at most one
    (a rank may be empty when the dataset has fewer samples than ranks). The order is fixed;
    ``set_epoch`` is accepted, like DistributedSampler's, and changes nothing.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        _check_topology(num_replicas, rank)
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0

    def _indices(self) -> range:
        return range(self.rank, len(self.dataset), self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices())

    def __len__(self) -> int:
        return len(self._indices())

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch; the order does not depend on it (evaluation never shuffles)."""
        self.epoch = epoch

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_replicas={self.num_replicas}, rank={self.rank})"


def inject_distributed_sampler(
    dataloader: Any, num_replicas: int, rank: int, stage: str, seed: int = 0
) -> Any:
    """Return ``dataloader`` rebuilt so that process ``rank`` of ``num_replicas`` reads only its shard.

    A map-style DataLoader with the default sampler (``shuffle=False`` or ``True``) and the default
    BatchSampler comes back as a new loader of the same class over the same dataset, with every other
    setting read from the original, and the sampler replaced: a ``DistributedSampler`` (shuffled iff
    the original was, with ``seed``) for stage "fit", an ``ExactDistributedSampler`` for "validate",
    "test" and "predict". Anything else is returned as it is: one process (``num_replicas == 1``),
    an IterableDataset, a sampler or batch sampler the user set, or an object that is no DataLoader.

    Raises ConfigurationError for an unknown stage, an impossible rank, a dataset without a length,
    or a DataLoader subclass that cannot be constructed again with the standard DataLoader arguments.
    """
    if stage not in STAGES:
        raise unknown_name("stage", stage, STAGES)
    _check_topology(num_replicas, rank)
    if num_replicas == 1 or not isinstance(dataloader, DataLoader):
        return dataloader
    if isinstance(dataloader.dataset, IterableDataset):
        return dataloader  # an iterable dataset shards itself (e.g. with torch.utils.data.get_worker_info)
    if not _has_default_sampler(dataloader):
        log.debug(
            "Keeping the sampler %s and batch sampler %s the %s was given: no distributed sampler added for %r.",
            type(dataloader.sampler).__name__, type(dataloader.batch_sampler).__name__,
            type(dataloader).__name__, stage,
        )
        return dataloader
    dataset = dataloader.dataset
    try:
        len(dataset)
    except TypeError:
        raise ConfigurationError(
            f"The {type(dataset).__name__} given to the {type(dataloader).__name__} has no __len__, so it cannot be "
            f"split among {num_replicas} processes. Define __len__ on the dataset, make it an IterableDataset that "
            "shards itself, or pass Trainer(use_distributed_sampler=False) and give the loader a sampler yourself."
        ) from None

    sampler: Sampler[int]
    if stage == "fit":
        shuffle = isinstance(dataloader.sampler, RandomSampler)
        sampler = DistributedSampler(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False
        )
    else:
        if isinstance(dataloader.sampler, RandomSampler):
            log.debug("The %s dataloader asked for shuffle=True; evaluation reads the data in order.", stage)
        sampler = ExactDistributedSampler(dataset, num_replicas=num_replicas, rank=rank)
    return _rebuild(dataloader, sampler)


def pad_evaluation_shards(dataloader: Any, num_replicas: int, rank: int, stage: str, strategy: str) -> Any:
    """``dataloader`` giving every rank the same number of evaluation batches, for strategies whose forward is a
    collective (fsdp, deepspeed stage 3 gather parameters from all ranks in every forward).

    An evaluation loader with an ``ExactDistributedSampler`` whose samples do not split evenly comes back with a
    ``DistributedSampler`` that repeats a sample or two on the last ranks (the metrics count them; rank 0 says how
    many). Anything else comes back unchanged. ``strategy`` names the strategy in that message.
    """
    sampler = getattr(dataloader, "sampler", None)
    if stage == "fit" or not isinstance(sampler, ExactDistributedSampler):
        return dataloader
    size = len(sampler.dataset)
    if size % num_replicas == 0:
        return dataloader
    if rank == 0:
        log.warning(
            "The %s data (%d samples) do not split evenly among %d processes; under %s every rank must run the "
            "same number of batches, so %d sample(s) are evaluated twice and count twice in the %s metrics.",
            stage, size, num_replicas, strategy, -size % num_replicas, stage,
        )
    padded = DistributedSampler(sampler.dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
    return _rebuild(dataloader, padded)


def _check_topology(num_replicas: int, rank: int) -> None:
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ConfigurationError(f"num_replicas must be a positive integer (the number of processes), got {num_replicas!r}.")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ConfigurationError(
            f"rank must be an integer from 0 to num_replicas - 1 = {num_replicas - 1}, got {rank!r}."
        )


def _has_default_sampler(dataloader: DataLoader) -> bool:
    """Whether the sampler and batch sampler are the ones DataLoader builds from ``shuffle`` and ``batch_size``."""
    sampler, batch_sampler = dataloader.sampler, dataloader.batch_sampler
    if type(sampler) is SequentialSampler:
        default = sampler.data_source is dataloader.dataset
    elif type(sampler) is RandomSampler:
        # replacement or num_samples change what is drawn: that is a sampler the user chose, not shuffle=True
        default = sampler.data_source is dataloader.dataset and not sampler.replacement and sampler._num_samples is None
    else:
        default = False
    if batch_sampler is None:  # batch_size=None: no automatic batching
        return default
    # a BatchSampler the user passed has its own sampler object (and leaves dataloader.batch_size None)
    return (
        default
        and type(batch_sampler) is BatchSampler
        and batch_sampler.sampler is sampler
        and dataloader.batch_size is not None
    )


def _rebuild(dataloader: DataLoader, sampler: Sampler[int]) -> DataLoader:
    """Construct a loader of ``dataloader``'s class with its settings and ``sampler``."""
    cls = type(dataloader)
    settings = {name: getattr(dataloader, name) for name in _SETTINGS if hasattr(dataloader, name)}
    given: dict[str, Any] = {"dataset": dataloader.dataset, "sampler": sampler, **settings}
    params = _init_parameters(cls)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in given.items() if takes_any or _by_keyword(params.get(k))}
    if _by_keyword(params.get("shuffle")):
        kwargs["shuffle"] = False  # a subclass default of shuffle=True would clash with the sampler
    for required in ("dataset", "sampler"):
        if required not in kwargs:
            raise _cannot_rebuild(cls, f"its __init__ takes no {required!r} argument")
    # arguments only the subclass has: reuse the attribute of the same name when the instance kept one
    standard = _init_parameters(DataLoader)
    for name, param in params.items():
        if name in kwargs or name in standard or not _by_keyword(param):
            continue
        if name in vars(dataloader):
            kwargs[name] = vars(dataloader)[name]
        elif param.default is inspect.Parameter.empty:
            raise _cannot_rebuild(
                cls, f"its __init__ requires the argument {name!r}, which is not kept as an attribute of the same name"
            )
    try:
        rebuilt = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise _cannot_rebuild(cls, f"calling it with the standard arguments failed with {type(exc).__name__}: {exc}") from exc
    if rebuilt.sampler is not sampler:
        raise _cannot_rebuild(cls, "its __init__ did not use the 'sampler' argument it was given")
    lost = [n for n in sorted(_PLAIN_SETTINGS - kwargs.keys()) if n in settings and getattr(rebuilt, n, None) != settings[n]]
    if lost:
        raise _cannot_rebuild(
            cls,
            f"its __init__ takes no {', '.join(map(repr, lost))} argument, so "
            f"{'that setting' if len(lost) == 1 else 'those settings'} would change "
            f"({', '.join(f'{n}={settings[n]!r}' for n in lost)} before)",
        )
    return rebuilt


def _init_parameters(cls: type) -> dict[str, inspect.Parameter]:
    params = list(inspect.signature(cls.__init__).parameters.values())
    return {p.name: p for p in params[1:]}  # without self


def _by_keyword(param: inspect.Parameter | None) -> bool:
    return param is not None and param.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _cannot_rebuild(cls: type, why: str) -> ConfigurationError:
    return ConfigurationError(
        f"torchfleet cannot add a distributed sampler to your {cls.__module__}.{cls.__qualname__}: {why}. To give "
        f"each process its own shard, torchfleet constructs a new {cls.__name__} with the dataset, the distributed "
        "sampler and the settings read from the original (batch_size, num_workers, collate_fn, ...) as keyword "
        f"arguments. Either let {cls.__name__}.__init__ accept the standard DataLoader arguments (for example take "
        "**kwargs and pass them on to DataLoader.__init__), or pass Trainer(use_distributed_sampler=False) and give "
        "your loader a torch.utils.data.DistributedSampler (or another per-rank sampler) yourself."
    )


def without_shuffle(dataloader: Any, stage: str) -> Any:
    """``dataloader`` reading its data in order: a shuffling default sampler is replaced, with a warning.

    For ``Trainer(overfit_batches=...)``, which trains on the same first batches every epoch. Other loaders
    (iterable datasets, samplers the user chose) are returned as they are.
    """
    if not isinstance(dataloader, DataLoader) or not _has_default_sampler(dataloader):
        return dataloader
    if type(dataloader.sampler) is not RandomSampler:
        return dataloader
    warnings.warn(
        f"Trainer(overfit_batches=...) uses the same {stage} batches every epoch, but the {stage} dataloader "
        "shuffles (shuffle=True): torchfleet reads it in order instead.",
        UserWarning,
        stacklevel=3,
    )
    return _rebuild(dataloader, SequentialSampler(dataloader.dataset))
