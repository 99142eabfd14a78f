"""inject_distributed_sampler: each rank's shard of a DataLoader, checked in one process for every rank."""

from __future__ import annotations

import logging
import multiprocessing
from collections import Counter

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
)

from torchfleet.data import inject_distributed_sampler as from_data
from torchfleet.errors import ConfigurationError
from torchfleet.samplers import ExactDistributedSampler, inject_distributed_sampler

EVAL_STAGES = ("validate", "test", "predict")


class Numbers(Dataset):
    """Sample i is the integer i, so a batch tells which indices a rank read."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(5))


def read(loader) -> list[int]:
    """Every sample index the loader yields, in order."""
    out: list[int] = []
    for batch in loader:
        out.extend(torch.as_tensor(batch).reshape(-1).tolist())
    return out


def shards(loader, n_ranks: int, stage: str, seed: int = 0) -> list[list[int]]:
    return [read(inject_distributed_sampler(loader, n_ranks, r, stage, seed=seed)) for r in range(n_ranks)]


def sampler_orders(loader, n_ranks: int, seed: int = 0, epoch: int | None = None) -> list[list[int]]:
    out = []
    for r in range(n_ranks):
        sampler = inject_distributed_sampler(loader, n_ranks, r, "fit", seed=seed).sampler
        if epoch is not None:
            sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


# ------------------------------------------------------------------------------------------ evaluation
@pytest.mark.parametrize("stage", EVAL_STAGES)
@pytest.mark.parametrize(("n", "n_ranks"), [(10, 3), (1, 2), (5, 8), (12, 4), (7, 7), (11, 2)])
@pytest.mark.parametrize("batch_size", [1, 4, None])
def test_eval_shards_cover_the_dataset_exactly_once(stage, n, n_ranks, batch_size):
    loader = DataLoader(Numbers(n), batch_size=batch_size)
    parts = shards(loader, n_ranks, stage)
    assert Counter(i for part in parts for i in part) == Counter(range(n))  # each sample once, none padded
    lengths = [len(p) for p in parts]
    assert max(lengths) - min(lengths) <= 1
    for r, part in enumerate(parts):
        assert part == list(range(r, n, n_ranks))  # rank r: r, r+N, r+2N, ... in order


def test_one_sample_two_ranks_leaves_one_rank_empty():
    loader = DataLoader(Numbers(1), batch_size=4)
    first = inject_distributed_sampler(loader, 2, 0, "validate")
    second = inject_distributed_sampler(loader, 2, 1, "validate")
    assert read(first) == [0]
    assert len(second) == 0 and len(second.sampler) == 0
    assert list(second) == []  # iterating an empty shard is no error


@pytest.mark.parametrize("stage", EVAL_STAGES)
def test_eval_never_shuffles_and_uses_the_exact_sampler(stage):
    loader = DataLoader(Numbers(10), batch_size=2, shuffle=True)
    rebuilt = inject_distributed_sampler(loader, 3, 1, stage)
    assert type(rebuilt.sampler) is ExactDistributedSampler
    assert read(rebuilt) == [1, 4, 7]
    assert read(rebuilt) == [1, 4, 7]  # same order on every pass


def test_exact_sampler_set_epoch_changes_nothing():
    sampler = ExactDistributedSampler(Numbers(10), num_replicas=3, rank=0)
    before = list(sampler)
    sampler.set_epoch(5)
    assert list(sampler) == before == [0, 3, 6, 9]
    assert len(sampler) == 4


@pytest.mark.parametrize(("num_replicas", "rank"), [(0, 0), (3, 3), (3, -1), (2, 1.0), (True, 0)])
def test_impossible_topology_is_refused(num_replicas, rank):
    with pytest.raises(ConfigurationError, match="num_replicas|rank"):
        inject_distributed_sampler(DataLoader(Numbers(4)), num_replicas, rank, "test")
    with pytest.raises(ConfigurationError):
        ExactDistributedSampler(Numbers(4), num_replicas, rank)


def test_unknown_stage_is_refused():
    with pytest.raises(ConfigurationError, match="'validation'.*'validate'"):
        inject_distributed_sampler(DataLoader(Numbers(4)), 2, 0, "validation")


# ------------------------------------------------------------------------------------------ training
@pytest.mark.parametrize("shuffle", [False, True])
def test_fit_uses_a_distributed_sampler_like_the_user_shuffled(shuffle):
    loader = DataLoader(Numbers(12), batch_size=2, shuffle=shuffle)
    rebuilt = inject_distributed_sampler(loader, 3, 2, "fit", seed=7)
    sampler = rebuilt.sampler
    assert type(sampler) is DistributedSampler
    assert (sampler.shuffle, sampler.seed, sampler.num_replicas, sampler.rank) == (shuffle, 7, 3, 2)
    assert sampler.drop_last is False
    assert rebuilt.batch_sampler.sampler is sampler


@pytest.mark.parametrize("shuffle", [False, True])
def test_fit_shards_are_disjoint_and_cover_the_dataset(shuffle):
    loader = DataLoader(Numbers(12), batch_size=3, shuffle=shuffle)
    parts = shards(loader, 3, "fit", seed=3)
    assert all(len(p) == 4 for p in parts)
    assert sorted(i for p in parts for i in p) == list(range(12))  # disjoint and covering
    if not shuffle:
        assert parts == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
    else:
        assert parts != [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]


def test_fit_pads_uneven_shards_to_equal_length():
    # DistributedSampler(drop_last=False): every rank runs the same number of steps, padded by repeats
    parts = shards(DataLoader(Numbers(10), batch_size=1, shuffle=True), 3, "fit")
    assert [len(p) for p in parts] == [4, 4, 4]
    assert set(i for p in parts for i in p) == set(range(10))


def test_fit_seed_is_the_same_on_every_rank():
    loader = DataLoader(Numbers(20), shuffle=True)
    orders = sampler_orders(loader, 4, seed=11)
    assert {inject_distributed_sampler(loader, 4, r, "fit", seed=11).sampler.seed for r in range(4)} == {11}
    assert sorted(i for o in orders for i in o) == list(range(20))
    assert sampler_orders(loader, 4, seed=11) == orders  # deterministic given the seed
    assert sampler_orders(loader, 4, seed=12) != orders  # and the seed matters


def test_set_epoch_reshuffles_only_when_shuffling():
    shuffled = DataLoader(Numbers(20), batch_size=5, shuffle=True)
    epoch0 = sampler_orders(shuffled, 2)
    epoch1 = sampler_orders(shuffled, 2, epoch=1)
    assert epoch1 != epoch0
    assert sorted(epoch1[0] + epoch1[1]) == list(range(20))  # still disjoint and covering after set_epoch
    in_order = DataLoader(Numbers(20), batch_size=5)
    assert sampler_orders(in_order, 2, epoch=1) == sampler_orders(in_order, 2) == [
        list(range(0, 20, 2)), list(range(1, 20, 2))
    ]


def test_fit_loop_reaches_set_epoch_through_loader_sampler():
    rebuilt = inject_distributed_sampler(DataLoader(Numbers(8), shuffle=True), 2, 0, "fit")
    rebuilt.sampler.set_epoch(4)  # what FitLoop.run_epoch does
    assert rebuilt.sampler.epoch == 4


# ------------------------------------------------------------------------------------------ settings kept
def _collate_negated(batch):
    return torch.tensor([-i for i in batch])


def _worker_init(worker_id):
    pass


def test_user_settings_are_kept():
    data = Numbers(10)
    generator = torch.Generator().manual_seed(1)
    context = multiprocessing.get_context("spawn")
    loader = DataLoader(
        data, batch_size=3, shuffle=True, num_workers=2, collate_fn=_collate_negated, pin_memory=False,
        drop_last=True, timeout=5.0, worker_init_fn=_worker_init, multiprocessing_context=context,
        generator=generator, prefetch_factor=4, persistent_workers=True, pin_memory_device="",
    )
    for stage in ("fit", "validate"):
        rebuilt = inject_distributed_sampler(loader, 2, 1, stage)
        assert type(rebuilt) is DataLoader and rebuilt is not loader
        assert rebuilt.dataset is data
        assert rebuilt.batch_size == 3 and rebuilt.drop_last is True
        assert rebuilt.batch_sampler.batch_size == 3 and rebuilt.batch_sampler.drop_last is True
        assert rebuilt.num_workers == 2
        assert rebuilt.collate_fn is _collate_negated
        assert rebuilt.timeout == 5.0
        assert rebuilt.worker_init_fn is _worker_init
        assert rebuilt.multiprocessing_context is context
        assert rebuilt.generator is generator
        assert rebuilt.prefetch_factor == 4
        assert rebuilt.persistent_workers is True
        assert loader.sampler.__class__ is RandomSampler  # the original is left as it was


def test_in_order_is_kept_where_torch_has_it():
    if not hasattr(DataLoader(Numbers(2)), "in_order"):
        pytest.skip("this torch has no DataLoader(in_order=...)")
    loader = DataLoader(Numbers(6), num_workers=2, in_order=False)
    assert inject_distributed_sampler(loader, 2, 0, "test").in_order is False


def test_num_workers_zero_is_kept_and_settings_act_on_the_shard():
    loader = DataLoader(Numbers(10), batch_size=2, drop_last=True, collate_fn=_collate_negated)
    rebuilt = inject_distributed_sampler(loader, 2, 0, "validate")
    assert rebuilt.num_workers == 0 and rebuilt.prefetch_factor is None
    batches = [b.tolist() for b in rebuilt]
    assert batches == [[0, -2], [-4, -6]]  # shard 0,2,4,6,8 negated; the incomplete last batch dropped


def test_unbatched_loader_stays_unbatched():
    rebuilt = inject_distributed_sampler(DataLoader(Numbers(5), batch_size=None), 2, 1, "fit")
    assert rebuilt.batch_size is None and rebuilt.batch_sampler is None
    assert list(rebuilt) == [1, 3, 0]  # no batch dimension; padded with 0 to match rank 0's three samples


# ------------------------------------------------------------------------------------------ left unchanged
class PerRank:
    """A per-rank sampler from outside torch: no DistributedSampler, but it names its rank as torch's does."""

    def __init__(self, num_replicas: int, rank: int) -> None:
        self.num_replicas, self.rank = num_replicas, rank

    def __iter__(self):
        return iter(range(self.rank, 8, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, 8, self.num_replicas))


@pytest.mark.parametrize(
    "make",
    [
        lambda d: DataLoader(d, sampler=DistributedSampler(d, num_replicas=2, rank=0), batch_size=2),
        lambda d: DataLoader(d, batch_sampler=BatchSampler(DistributedSampler(d, num_replicas=2, rank=0), 2, False)),
        lambda d: DataLoader(d, sampler=PerRank(2, 1), batch_size=2),
        lambda d: DataLoader(d, sampler=ExactDistributedSampler(d, num_replicas=2, rank=1), batch_size=2),
    ],
    ids=["distributed", "batches-of-distributed", "per-rank-elsewhere", "exact"],
)
@pytest.mark.parametrize("stage", ["fit", "predict"])
def test_a_sampler_that_already_reads_one_rank_is_kept(make, stage, caplog):
    loader = make(Numbers(8))
    with caplog.at_level(logging.DEBUG, logger="torchfleet.samplers"):
        assert inject_distributed_sampler(loader, 2, 1, stage) is loader  # sharding it again would drop half
    assert "already reads one rank's part" in caplog.text


def test_iterable_dataset_is_untouched_with_one_warning_from_rank_zero(monkeypatch, recwarn):
    from torchfleet import samplers

    monkeypatch.setattr(samplers, "_WARNED_ITERABLE", set())
    loader = DataLoader(Stream(), batch_size=2)
    assert inject_distributed_sampler(loader, 2, 1, "fit") is loader
    assert not recwarn.list  # rank 1 stays silent: rank 0 says it for the run
    for stage in ("fit", "validate", "fit"):
        assert inject_distributed_sampler(loader, 2, 0, stage) is loader
    (warning,) = recwarn.list
    text = str(warning.message)
    assert "Stream" in text and "IterableDataset" in text and "2 processes" in text
    assert "use_distributed_sampler=False" in text and "get_rank()" in text
    assert read(loader) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("stage", ["fit", "validate", "test", "predict"])
def test_one_process_returns_the_same_object(stage):
    loader = DataLoader(Numbers(8), batch_size=2, shuffle=True)
    assert inject_distributed_sampler(loader, 1, 0, stage) is loader


def test_something_that_is_no_dataloader_is_untouched():
    batches = [torch.zeros(2), torch.ones(2)]
    assert inject_distributed_sampler(batches, 2, 0, "fit") is batches


def test_dataset_without_length_is_refused():
    class NoLength(Dataset):
        def __getitem__(self, i):
            return i

    with pytest.raises(ConfigurationError, match="NoLength.*__len__"):
        inject_distributed_sampler(DataLoader(NoLength()), 2, 0, "fit")


def test_importable_from_data_module():
    assert from_data is inject_distributed_sampler


# ------------------------------------------------------------------------------------------ subclasses
class ForwardingLoader(DataLoader):
    """Takes the standard arguments through **kwargs and keeps an argument of its own."""

    def __init__(self, dataset, *args, tag: str = "none", **kwargs):
        super().__init__(dataset, *args, **kwargs)
        self.tag = tag


class ExplicitLoader(DataLoader):
    """Names the arguments it uses; fixes the rest itself; has a required argument kept as an attribute."""

    def __init__(self, dataset, scale, batch_size=1, shuffle=True, sampler=None, drop_last=False):
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, drop_last=drop_last)
        self.scale = scale


class FixedLoader(DataLoader):
    """Cannot take a sampler."""

    def __init__(self, dataset):
        super().__init__(dataset, batch_size=2, shuffle=True)


class UnkeptArgLoader(DataLoader):
    """Needs an argument it does not keep, so it cannot be rebuilt."""

    def __init__(self, dataset, secret, **kwargs):
        super().__init__(dataset, **kwargs)


class IgnoresSamplerLoader(DataLoader):
    """Accepts everything but drops the sampler."""

    def __init__(self, dataset, **kwargs):
        kwargs.pop("sampler", None)
        super().__init__(dataset, **kwargs)


class NoPinLoader(DataLoader):
    """Takes batch_size but not pin_memory, so a user's pin_memory=True could not survive."""

    def __init__(self, dataset, batch_size=1, sampler=None, pin=False):
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, pin_memory=pin)


@pytest.mark.parametrize("stage", ["fit", "test"])
def test_subclass_taking_standard_arguments_is_rebuilt(stage):
    loader = ForwardingLoader(Numbers(9), batch_size=2, collate_fn=_collate_negated, tag="mine")
    rebuilt = inject_distributed_sampler(loader, 3, 0, stage)
    assert type(rebuilt) is ForwardingLoader and rebuilt is not loader
    assert rebuilt.tag == "mine"  # its own argument, recovered from the attribute
    assert rebuilt.batch_size == 2 and rebuilt.collate_fn is _collate_negated
    assert [b.tolist() for b in rebuilt] == [[0, -3], [-6]]


def test_subclass_with_named_arguments_is_rebuilt():
    loader = ExplicitLoader(Numbers(6), scale=2.5, batch_size=3, shuffle=False)
    rebuilt = inject_distributed_sampler(loader, 2, 1, "validate")
    assert type(rebuilt) is ExplicitLoader
    assert rebuilt.scale == 2.5 and rebuilt.batch_size == 3
    assert read(rebuilt) == [1, 3, 5]  # its shuffle=True default did not clash with the sampler


@pytest.mark.parametrize(
    ("cls", "why"),
    [
        (FixedLoader, "takes no 'sampler' argument"),
        (UnkeptArgLoader, "requires the argument 'secret'"),
        (IgnoresSamplerLoader, "did not use the 'sampler'"),
    ],
)
def test_subclass_that_cannot_be_rebuilt_raises_a_clear_error(cls, why):
    loader = cls(Numbers(6)) if cls is FixedLoader else cls(Numbers(6), **({"secret": 1} if cls is UnkeptArgLoader else {}))
    with pytest.raises(ConfigurationError) as info:
        inject_distributed_sampler(loader, 2, 0, "fit")
    text = str(info.value)
    assert cls.__name__ in text and why in text
    assert "accept the standard DataLoader arguments" in text
    assert "Trainer(use_distributed_sampler=False)" in text and "DistributedSampler" in text
    assert "\n" not in text  # one paragraph


def test_subclass_that_would_lose_a_setting_raises():
    loader = NoPinLoader(Numbers(6), batch_size=2, pin=True)
    with pytest.raises(ConfigurationError, match="NoPinLoader.*'pin_memory'.*pin_memory=True"):
        inject_distributed_sampler(loader, 2, 0, "fit")
    # with the default pin=False nothing is lost, so it is rebuilt
    assert type(inject_distributed_sampler(NoPinLoader(Numbers(6), batch_size=2), 2, 0, "fit")) is NoPinLoader


def test_subclass_error_from_init_is_wrapped():
    class Picky(DataLoader):
        def __init__(self, dataset, **kwargs):
            if kwargs.get("sampler") is not None:
                raise ValueError("no samplers here")
            super().__init__(dataset, **kwargs)

    with pytest.raises(ConfigurationError, match="Picky.*ValueError: no samplers here") as info:
        inject_distributed_sampler(Picky(Numbers(4)), 2, 0, "test")
    assert isinstance(info.value.__cause__, ValueError)
