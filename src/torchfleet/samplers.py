"""Adapting a user's DataLoader for distributed training: one shard of the dataset per process.

``inject_distributed_sampler`` is what parallel strategies call from ``process_dataloader``. It
gives each rank its own part of a map-style DataLoader's data:

* the default sampler (the one ``shuffle=False/True`` chose), training ("fit"): a
  ``torch.utils.data.DistributedSampler``, shuffled iff the loader shuffles, seeded alike on every
  rank so the shards are disjoint; the fit loop calls ``set_epoch``. The Trainer first makes its
  training loader shuffle (``shuffled_for_training``), as Lightning's Trainer does; Fleet does not.
* the default sampler, evaluation ("validate", "test", "predict"): an ``ExactDistributedSampler``,
  which sees every sample exactly once over all ranks (no padding), in a fixed order.
* a sampler or batch sampler the user set (``SubsetRandomSampler``, ``WeightedRandomSampler``, a
  ``batch_sampler=``): a ``ShardedSampler`` around it, which draws the user's epoch alike on every
  rank and deals its items (indices, or whole batches) out to the ranks; padded for training,
  exact for evaluation, as above.

Loaders it cannot or should not touch come back unchanged: one process, a sampler that already
reads one rank's part (a DistributedSampler), an object that is no DataLoader, and an
IterableDataset, which cannot be split from outside (a warning says so, once per dataset class).
``set_sampler_epoch`` is what the loops call at the start of each training epoch.
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Sized
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


class ShardedSampler(Sampler[Any]):
    """Rank ``rank`` of ``num_replicas`` takes items ``rank, rank + num_replicas, ...`` of a user's sampler's epoch.

    ``sampler`` is anything sized and iterable whose items the DataLoader reads: a sampler (indices) or a
    batch sampler (lists of indices, dealt out whole, so the user's batches stay as they were drawn).
    Each pass, every rank draws the whole epoch from ``sampler`` with this process's own random generators, as
    Lightning's ``DistributedSamplerWrapper`` does (so the orders are Lightning's and Fabric's, and the draw
    advances the global generator), and keeps its positions, in the order drawn (Lightning's Trainer also permutes
    the drawn epoch by the seed and epoch; torchfleet's Trainer does not: a sampler of one's own says the order,
    docs/porting.md).

    The ranks' parts are disjoint only when every rank drew the same epoch (the same seed on every rank, or a
    sampler generator seeded alike). Lightning does not check it; here ``compare`` (the strategy's
    ``all_gather_object``: one small collective each pass) gathers a digest of every rank's draw, and draws that
    differ stop every rank with one ConfigurationError (``draws_differ``). ``set_epoch`` is passed on to the
    sampler when it has one, and to a batch sampler's sampler.

    ``even=True`` (training): every rank gets ``ceil(n / num_replicas)`` items; the last positions repeat
    the epoch's first items, as torch's DistributedSampler pads, so no rank waits for a batch the others
    never start. ``even=False`` (evaluation): nothing is repeated; ranks differ in length by at most one.
    """

    def __init__(self, sampler: Any, num_replicas: int, rank: int, *, even: bool, seed: int = 0,
                 compare: Callable[..., list[Any]] | None = None) -> None:
        _check_topology(num_replicas, rank)
        self.sampler = sampler
        self.num_replicas = num_replicas
        self.rank = rank
        self.even = even
        self.seed = seed
        self.compare = compare
        self.epoch = 0

    def _positions(self, n: int) -> range:
        if self.even:
            return range(self.rank, -(-n // self.num_replicas) * self.num_replicas, self.num_replicas)
        return range(self.rank, n, self.num_replicas)

    def epoch_items(self) -> list[Any]:
        """The whole epoch of the wrapped sampler, drawn now (checked against the other ranks' draws when
        ``compare`` is set), in the order its items are dealt out."""
        items = list(self.sampler)
        if self.compare is not None:
            digests = self.compare(_digest(items), name="sampler draw check")
            if any(d != digests[0] for d in digests):
                raise draws_differ(self.sampler, digests)
        return items

    def __iter__(self) -> Iterator[Any]:
        items = self.epoch_items()
        # position p beyond the epoch's end repeats item p - n (padding; only with even=True)
        return iter([items[p % len(items)] for p in self._positions(len(items))])

    def __len__(self) -> int:
        return len(self._positions(len(self.sampler)))

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch (the shuffle's seed) and tell the wrapped sampler, when it takes ``set_epoch``."""
        self.epoch = epoch
        for inner in self._told():
            inner.set_epoch(epoch)

    def _told(self) -> list[Any]:
        """What ``set_epoch`` reaches: the wrapped sampler and, for a batch sampler, its sampler (as Lightning tells
        a loader's ``batch_sampler.sampler``), each once, where it has ``set_epoch``."""
        inner = [self.sampler, getattr(self.sampler, "sampler", None)]
        if inner[1] is inner[0]:
            del inner[1]
        return [s for s in inner if s is not None and callable(getattr(s, "set_epoch", None))]

    def copy(self, *, even: bool) -> ShardedSampler:
        """A ShardedSampler over the same sampler with the same settings but ``even``."""
        return ShardedSampler(self.sampler, self.num_replicas, self.rank, even=even, seed=self.seed,
                              compare=self.compare)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.sampler!r}, num_replicas={self.num_replicas}, rank={self.rank}, "
                f"even={self.even})")


def _digest(items: list[Any]) -> bytes:
    """16 bytes that differ when two ranks' draws differ (indices, or a batch sampler's lists of indices)."""
    import hashlib

    return hashlib.blake2b(repr(items).encode(), digest_size=16).digest()


def draws_differ(sampler: Any, digests: list[Any]) -> ConfigurationError:
    """The error every rank raises when the ranks drew different epochs from a sampler of the user's."""
    groups: dict[Any, list[int]] = {}
    for rank, digest in enumerate(digests):
        groups.setdefault(digest, []).append(rank)
    described = "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))} drew order {k + 1}"
                          for k, r in enumerate(groups.values()))
    name, world = type(sampler).__name__, len(digests)
    return ConfigurationError(
        f"The processes drew different orders from your {name} ({described}). Each of the {world} processes draws "
        f"the whole epoch from the {name} with its own random generator and keeps every {world}th item of it, so "
        "with different draws their parts overlap and some samples are never trained on. Seed the sampler's "
        "randomness alike on every process: call torchfleet.seed_everything(seed) with the same seed on every "
        f"process before the {name} draws, or give it a generator seeded the same on every process (for example "
        "generator=torch.Generator().manual_seed(seed)); or pass use_distributed_sampler=False and give each "
        "process its own part yourself."
    )


def set_sampler_epoch(dataloader: Any, epoch: int) -> None:
    """Call ``set_epoch(epoch)`` on the loader's sampler, batch sampler and the batch sampler's sampler.

    Each object once, where it has the method: a DistributedSampler reshuffles, a ShardedSampler
    draws the user's sampler anew, and a user's own batch sampler with ``set_epoch`` hears of the epoch.
    """
    seen: set[int] = set()
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    for owner in (getattr(dataloader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        set_epoch = getattr(owner, "set_epoch", None)
        if owner is None or id(owner) in seen or not callable(set_epoch):
            continue
        seen.add(id(owner))
        set_epoch(epoch)
        if isinstance(owner, ShardedSampler):
            seen.update(id(inner) for inner in owner._told())  # told by the ShardedSampler already


def inject_distributed_sampler(
    dataloader: Any, num_replicas: int, rank: int, stage: str, seed: int = 0, *,
    compare: Callable[..., list[Any]] | None = None,
) -> Any:
    """Return ``dataloader`` rebuilt so that process ``rank`` of ``num_replicas`` reads only its shard.

    A map-style DataLoader comes back as a new loader of the same class over the same dataset, with every
    other setting read from the original. With the default sampler (``shuffle=False`` or ``True``) and
    BatchSampler, the sampler is replaced: a ``DistributedSampler`` (shuffled iff the original was, with
    ``seed``) for stage "fit", an ``ExactDistributedSampler`` for "validate", "test" and "predict". A
    sampler or batch sampler the user set is wrapped in a ``ShardedSampler`` (``even`` for "fit" only; the ranks'
    draws checked by ``compare``).
    Returned as they are: one process (``num_replicas == 1``), an object that is no DataLoader, a sampler
    that already reads one rank's part, and an IterableDataset (with a warning from rank 0, once per class).

    Raises ConfigurationError for an unknown stage, an impossible rank, a dataset without a length under
    the default sampler, or a DataLoader subclass that cannot be constructed again with the standard
    DataLoader arguments.
    """
    if stage not in STAGES:
        raise unknown_name("stage", stage, STAGES)
    _check_topology(num_replicas, rank)
    if num_replicas == 1 or not isinstance(dataloader, DataLoader):
        return dataloader
    if isinstance(dataloader.dataset, IterableDataset):
        if rank == 0:
            _warn_iterable_once(dataloader.dataset, num_replicas, stage)
        return dataloader
    if not _has_default_sampler(dataloader):
        return _shard_user_sampler(dataloader, num_replicas, rank, stage, seed, compare)
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


def shard_for_rank(dataloader: Any, sampler_kwargs: dict[str, int], stage: str, even: str | None = None, *,
                   compare: Callable[..., list[Any]] | None = None) -> Any:
    """``dataloader`` reading this rank's share: what both clients do before ``Strategy.process_dataloader``.

    ``sampler_kwargs``: the strategy's ``distributed_sampler_kwargs`` (``num_replicas``, ``rank``); the shuffle seed
    is ``seed_everything``'s (``TF_GLOBAL_SEED``, else 0). ``even``: the strategy's ``even_evaluation_shards``
    (every rank then gets the same number of evaluation batches; ``pad_evaluation_shards``). ``compare``: as
    ``inject_distributed_sampler``'s (the strategy's ``all_gather_object``).
    """
    num_replicas, rank = sampler_kwargs["num_replicas"], sampler_kwargs["rank"]
    seed = int(os.environ.get("TF_GLOBAL_SEED", "0"))
    loader = inject_distributed_sampler(dataloader, num_replicas, rank, stage, seed=seed, compare=compare)
    if even is not None:
        loader = pad_evaluation_shards(loader, num_replicas, rank, stage, even)
    return loader


def shuffled_for_training(dataloader: Any) -> Any:
    """``dataloader`` as if made with ``shuffle=True`` when it reads in order with the default sampler, else unchanged.

    What Lightning's Trainer does to a distributed run's training loader: its DistributedSampler always
    shuffles (seeded with the global seed, reshuffled each epoch by ``set_epoch``), whatever the loader's
    ``shuffle``. The Trainer calls this before the strategy injects its sampler; Fleet does not (Fabric
    keeps the loader's choice). A sampler of the user's own is left as it is.
    """
    if (not isinstance(dataloader, DataLoader) or isinstance(dataloader.dataset, IterableDataset)
            or type(dataloader.sampler) is not SequentialSampler or not _has_default_sampler(dataloader)):
        return dataloader
    return _rebuild(dataloader, RandomSampler(dataloader.dataset))


def _shard_user_sampler(dataloader: DataLoader, num_replicas: int, rank: int, stage: str, seed: int,
                        compare: Callable[..., list[Any]] | None) -> DataLoader:
    """``dataloader`` with the sampler, or batch sampler, the user set wrapped in a ShardedSampler."""
    # sampler=... (with the loader's own BatchSampler, or none): deal out indices, each rank batches its own;
    # batch_sampler=...: deal out the user's batches whole
    own_batches = dataloader.batch_sampler is not None and not _batches_built_by_loader(dataloader)
    user = dataloader.batch_sampler if own_batches else dataloader.sampler
    if _reads_one_rank(user) or _reads_one_rank(getattr(user, "sampler", None)):
        log.debug("Keeping %s: it already reads one rank's part of the data.", type(user).__name__)
        return dataloader
    try:
        len(user)
    except TypeError:
        raise ConfigurationError(
            f"The {type(user).__name__} given to the {type(dataloader).__name__} has no __len__, so torchfleet "
            f"cannot deal its {'batches' if own_batches else 'indices'} out to {num_replicas} processes with as many "
            "batches each. Define __len__ on it, or pass use_distributed_sampler=False and give each process its "
            "own part yourself."
        ) from None
    # a batch sampler's batches are dealt out in the order it drew them
    shard = ShardedSampler(user, num_replicas, rank, even=stage == "fit", seed=seed, compare=compare)
    if own_batches:
        return _rebuild(dataloader, batch_sampler=shard)
    return _rebuild(dataloader, shard)


def _reads_one_rank(sampler: Any) -> bool:
    """Whether ``sampler`` already yields one rank's part (sharding it again would drop data)."""
    if isinstance(sampler, (DistributedSampler, ExactDistributedSampler, ShardedSampler)):
        return True
    # per-rank samplers outside torch (recipes' DistributedWeightedSampler, ...) name their rank as torch's does
    return isinstance(getattr(sampler, "num_replicas", None), int) and isinstance(getattr(sampler, "rank", None), int)


#: dataset classes the IterableDataset warning was given for (in this process)
_WARNED_ITERABLE: set[str] = set()


def _warn_iterable_once(dataset: Any, num_replicas: int, stage: str) -> None:
    cls = type(dataset)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if name in _WARNED_ITERABLE:
        return
    _WARNED_ITERABLE.add(name)
    warnings.warn(
        f"The {stage} DataLoader reads a {cls.__name__}, an IterableDataset, which torchfleet cannot split among the "
        f"{num_replicas} processes: unless {cls.__name__}.__iter__ yields only this process's part (for example by "
        "torch.distributed.get_rank() and get_world_size(), and torch.utils.data.get_worker_info() for workers), "
        f"every process reads every sample, so each is trained on (and counted in metrics) {num_replicas} times. "
        "Pass use_distributed_sampler=False once the dataset shards itself to silence this warning.",
        UserWarning,
        stacklevel=4,
    )


def even_shards(dataloader: Any, num_replicas: int, rank: int) -> tuple[Any, int, int]:
    """An evaluation loader that ``inject_distributed_sampler`` split exactly, made to give every rank as many items.

    Returns ``(loader, repeated, size)``: ``repeated`` items (samples, or a batch sampler's batches) of the
    ``size`` in the epoch are read twice to even the ranks out, as DistributedSampler pads; ``(dataloader, 0,
    size)`` when they divide evenly or the loader was not split exactly. For strategies whose every forward
    needs all ranks (fsdp), where a rank with one batch more would wait for the others forever.
    """
    sampler = getattr(dataloader, "sampler", None)
    if isinstance(sampler, ExactDistributedSampler):
        size = len(sampler.dataset)
        if size % num_replicas == 0:
            return dataloader, 0, size
        padded = DistributedSampler(sampler.dataset, num_replicas=num_replicas, rank=rank, shuffle=False,
                                    drop_last=False)
        return _rebuild(dataloader, padded), -size % num_replicas, size
    for attr in ("sampler", "batch_sampler"):
        shard = getattr(dataloader, attr, None)
        if not isinstance(shard, ShardedSampler) or shard.even:
            continue
        size = len(shard.sampler)
        if size % num_replicas == 0:
            return dataloader, 0, size
        even = shard.copy(even=True)
        rebuilt = _rebuild(dataloader, even) if attr == "sampler" else _rebuild(dataloader, batch_sampler=even)
        return rebuilt, -size % num_replicas, size
    return dataloader, 0, 0


def pad_evaluation_shards(dataloader: Any, num_replicas: int, rank: int, stage: str, strategy: str) -> Any:
    """``dataloader`` giving every rank the same number of evaluation batches, for strategies whose forward is a
    collective (fsdp, deepspeed stage 3 gather parameters from all ranks in every forward).

    An evaluation loader split exactly (``ExactDistributedSampler``, or a user's sampler in a ``ShardedSampler``)
    whose items do not split evenly comes back repeating an item or two on the last ranks (``even_shards``; the
    metrics count them, and rank 0 says how many). Anything else comes back unchanged. ``strategy`` names the
    strategy in that message.
    """
    if stage == "fit" or num_replicas == 1:
        return dataloader
    loader, repeated, size = even_shards(dataloader, num_replicas, rank)
    if repeated and rank == 0:
        log.warning(
            "The %s data (%d samples, or batches of a batch_sampler) do not split evenly among %d processes; under %s "
            "every rank must run the same number of batches, so %d of them are evaluated twice and count twice in "
            "the %s metrics.", stage, size, num_replicas, strategy, repeated, stage,
        )
    return loader


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
    # batch_size=None: no automatic batching
    return default and (batch_sampler is None or _batches_built_by_loader(dataloader))


def _batches_built_by_loader(dataloader: DataLoader) -> bool:
    """Whether the batch sampler is the BatchSampler the loader built from ``sampler``/``batch_size``/``drop_last``.

    A BatchSampler the user passed as ``batch_sampler=`` has its own sampler object (and leaves
    ``dataloader.batch_size`` None).
    """
    batch_sampler = dataloader.batch_sampler
    return (type(batch_sampler) is BatchSampler and batch_sampler.sampler is dataloader.sampler
            and dataloader.batch_size is not None)


def _rebuild(dataloader: DataLoader, sampler: Sampler[Any] | None = None, *, batch_sampler: Any = None) -> DataLoader:
    """Construct a loader of ``dataloader``'s class with its settings and ``sampler`` (or ``batch_sampler``)."""
    cls = type(dataloader)
    settings = {name: getattr(dataloader, name) for name in _SETTINGS if hasattr(dataloader, name)}
    if batch_sampler is None:
        given: dict[str, Any] = {"dataset": dataloader.dataset, "sampler": sampler, **settings}
    else:
        # a batch sampler excludes batch_size and drop_last (the loader's are None and False then)
        settings = {k: v for k, v in settings.items() if k not in ("batch_size", "drop_last")}
        given = {"dataset": dataloader.dataset, "batch_sampler": batch_sampler, **settings}
    params = _init_parameters(cls)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in given.items() if takes_any or _by_keyword(params.get(k))}
    if _by_keyword(params.get("shuffle")):
        kwargs["shuffle"] = False  # a subclass default of shuffle=True would clash with the sampler
    if batch_sampler is not None:
        # what DataLoader requires beside a batch sampler (a subclass's defaults may differ)
        kwargs.update({k: v for k, v in (("batch_size", 1), ("drop_last", False))
                       if takes_any or _by_keyword(params.get(k))})
    for required in ("dataset", "sampler" if batch_sampler is None else "batch_sampler"):
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
    if (rebuilt.sampler is not sampler) if batch_sampler is None else (rebuilt.batch_sampler is not batch_sampler):
        raise _cannot_rebuild(
            cls, f"its __init__ did not use the {'sampler' if batch_sampler is None else 'batch_sampler'!r} argument "
            "it was given")
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
    """``dataloader`` reading its data in order: any other sampler is replaced by a SequentialSampler, with a warning.

    For ``Trainer(overfit_batches=...)``, which trains on the same first batches every epoch; as Lightning, a
    sampler the user chose is replaced too. Iterable datasets and loaders with a batch sampler of the user's are
    returned as they are.
    """
    if not isinstance(dataloader, DataLoader) or type(dataloader.sampler) is SequentialSampler:
        return dataloader
    if isinstance(dataloader.dataset, IterableDataset) or not (
        dataloader.batch_sampler is None or _batches_built_by_loader(dataloader)
    ):
        return dataloader
    warnings.warn(
        f"You requested to overfit but enabled {stage} dataloader shuffling: Trainer(overfit_batches=...) uses the "
        f"same {stage} batches every epoch, but the {stage} dataloader shuffles or reorders its data (its sampler is a "
        f"{type(dataloader.sampler).__name__}): torchfleet reads it in order (a SequentialSampler) instead.",
        UserWarning,
        stacklevel=3,
    )
    return _rebuild(dataloader, SequentialSampler(dataloader.dataset))
