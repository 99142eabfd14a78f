"""A sampler or batch sampler the user set, dealt out to the ranks (ShardedSampler), checked in one process for
every rank. The multi-process runs (and the check that the ranks drew alike) are in
tests/distributed/test_user_samplers.py."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from tests.test_distributed_sampler import Numbers
from torchfleet import Fleet, Trainer
from torchfleet.errors import ConfigurationError
from torchfleet.samplers import (
    ShardedSampler,
    draws_differ,
    even_shards,
    inject_distributed_sampler,
    set_sampler_epoch,
)

IDS = [3, 1, 4, 15, 9, 2, 6, 5, 35, 8, 7]  # 11: not divisible by 2 or 3 ranks


class PythonShuffled(Sampler[int]):
    """Draws from Python's global generator (as many hand-written samplers do)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def __iter__(self):
        ids = list(self.ids)
        random.shuffle(ids)
        return iter(ids)

    def __len__(self) -> int:
        return len(self.ids)


class NumpyShuffled(PythonShuffled):
    """Draws from NumPy's global generator."""

    def __iter__(self):
        return iter(np.random.permutation(self.ids).tolist())


class EpochBatches(Sampler[list[int]]):
    """A batch sampler of the user's own that records the epochs it is told."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size, self.epochs = n, size, []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self):
        return iter([list(range(i, min(i + self.size, self.n))) for i in range(0, self.n, self.size)])

    def __len__(self) -> int:
        return -(-self.n // self.size)


def batches(loader) -> list[list[int]]:
    return [torch.as_tensor(b).reshape(-1).tolist() for b in loader]


def rank_reads(make, n_ranks: int, stage: str, epoch: int = 0) -> list[list[int]]:
    """What each rank reads; before each rank draws, the global generators are seeded alike, as
    ``seed_everything(100)`` seeds every process."""
    out = []
    for rank in range(n_ranks):
        loader = inject_distributed_sampler(make(), n_ranks, rank, stage, seed=7)
        set_sampler_epoch(loader, epoch)
        seed = 100
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        out.append([i for b in batches(loader) for i in b])
    return out


SAMPLERS = {
    "subset": (lambda: SubsetRandomSampler(IDS), Counter(IDS)),
    "weighted": (lambda: WeightedRandomSampler([0.0] * 4 + [1.0] * 8, num_samples=8, replacement=False),
                 Counter(range(4, 12))),
    "python-random": (lambda: PythonShuffled(IDS), Counter(IDS)),
    "numpy-random": (lambda: NumpyShuffled(IDS), Counter(IDS)),
    "other-data-source": (lambda: SequentialSampler(range(5)), Counter(range(5))),
    "num_samples": (lambda: RandomSampler(range(40), num_samples=9), None),
}


@pytest.mark.parametrize("n_ranks", [2, 3])
@pytest.mark.parametrize("case", list(SAMPLERS))
def test_evaluation_ranks_read_disjoint_parts_that_make_one_epoch(case, n_ranks):
    make_sampler, want = SAMPLERS[case]
    parts = rank_reads(lambda: DataLoader(Numbers(40), sampler=make_sampler(), batch_size=2), n_ranks, "validate")
    everything = [i for part in parts for i in part]
    if want is not None:
        assert Counter(everything) == want  # each sample of the epoch once
    else:  # 9 distinct draws out of 40: disjoint and 9 only if the ranks drew the same epoch
        assert len(everything) == len(set(everything)) == 9
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("case", ["subset", "python-random", "numpy-random"])
def test_training_ranks_get_equal_parts_padded_from_the_epochs_start(case):
    make_sampler, want = SAMPLERS[case]
    make = lambda: DataLoader(Numbers(40), sampler=make_sampler(), batch_size=2)  # noqa: E731
    parts = rank_reads(make, 2, "fit")
    assert [len(p) for p in parts] == [6, 6]
    assert [len(inject_distributed_sampler(make(), 2, r, "fit")) for r in (0, 1)] == [3, 3]  # batches
    everything = parts[0] + parts[1]
    assert set(everything) == set(want)
    (repeated,) = [i for i, c in Counter(everything).items() if c == 2]
    assert repeated == parts[0][0]  # the epoch's first item fills the last place, as DistributedSampler pads


def test_the_draw_is_the_users_sampler_drawn_from_the_global_generators_as_in_lightning():
    # Lightning's DistributedSamplerWrapper: list(sampler) from the process's generators, then every n-th item
    loader = inject_distributed_sampler(DataLoader(Numbers(40), sampler=PythonShuffled(IDS), batch_size=3), 2, 1, "fit")
    random.seed(5)
    drawn = list(loader.sampler)  # the sampler, not the loader: an iterator of any DataLoader draws its base seed
    after = random.getstate()
    random.seed(5)
    want = list(PythonShuffled(IDS))
    assert drawn == want[1::2] + [want[0]]  # rank 1's positions of 12 (the last one pads with the epoch's first)
    assert random.getstate() == after  # the generator moved on as it does when the user's sampler draws


def test_each_pass_draws_anew():
    loader = inject_distributed_sampler(
        DataLoader(Numbers(40), sampler=SubsetRandomSampler(list(range(20))), batch_size=4), 2, 0, "fit")
    torch.manual_seed(3)
    first, second = list(loader.sampler), list(loader.sampler)
    assert first != second and set(first) != set(second)


def test_draws_differ_names_the_ranks_and_what_to_do():
    error = draws_differ(SubsetRandomSampler([1, 2]), [b"a", b"b", b"a"])
    text = str(error)
    assert text.startswith("The processes drew different orders from your SubsetRandomSampler "
                           "(ranks 0, 2 drew order 1; rank 1 drew order 2).")
    assert "seed_everything(seed)" in text and "generator=torch.Generator().manual_seed(seed)" in text


def test_set_epoch_reaches_the_users_sampler():
    class Recording(SequentialSampler):
        def set_epoch(self, epoch):
            self.told = epoch

    user = Recording(range(6))
    loader = inject_distributed_sampler(DataLoader(Numbers(6), sampler=user, batch_size=2), 2, 1, "fit")
    set_sampler_epoch(loader, 3)
    assert user.told == 3 and loader.sampler.epoch == 3


def test_a_batch_sampler_is_dealt_out_in_whole_batches():
    user = BatchSampler(SequentialSampler(range(13)), 3, drop_last=False)
    drawn = list(user)  # 5 batches, the last of one index
    make = lambda: DataLoader(Numbers(13), batch_sampler=user)  # noqa: E731
    fit = [batches(inject_distributed_sampler(make(), 2, r, "fit")) for r in (0, 1)]
    assert fit == [[drawn[0], drawn[2], drawn[4]], [drawn[1], drawn[3], drawn[0]]]  # padded with the first batch
    val = [batches(inject_distributed_sampler(make(), 2, r, "validate")) for r in (0, 1)]
    assert val == [[drawn[0], drawn[2], drawn[4]], [drawn[1], drawn[3]]]
    rebuilt = inject_distributed_sampler(make(), 2, 1, "fit")
    assert isinstance(rebuilt.batch_sampler, ShardedSampler) and len(rebuilt) == 3


def test_a_list_of_batches_is_dealt_out():
    make = lambda: DataLoader(Numbers(8), batch_sampler=[[0, 1], [5], [6, 7]])  # noqa: E731
    assert [batches(inject_distributed_sampler(make(), 2, r, "test")) for r in (0, 1)] == [[[0, 1], [6, 7]], [[5]]]


def test_unbatched_loader_with_a_user_sampler_stays_unbatched():
    loader = DataLoader(Numbers(8), batch_size=None, sampler=SequentialSampler(range(5)))
    rebuilt = inject_distributed_sampler(loader, 2, 1, "predict")
    assert rebuilt.batch_size is None and rebuilt.batch_sampler is None
    assert list(rebuilt) == [1, 3]


class ForwardingLoader(DataLoader):
    def __init__(self, dataset, *args, tag: str = "none", **kwargs):
        super().__init__(dataset, *args, **kwargs)
        self.tag = tag


class FixedBatches(DataLoader):
    """Chooses its batches itself: it cannot be given a dealt-out batch sampler."""

    def __init__(self, dataset):
        super().__init__(dataset, batch_sampler=[[0], [1], [2, 3]])


def test_loader_subclass_is_rebuilt_with_the_dealt_out_batch_sampler():
    loader = ForwardingLoader(Numbers(6), batch_sampler=[[0], [1, 2], [3], [4, 5]], tag="mine", num_workers=0)
    rebuilt = inject_distributed_sampler(loader, 2, 1, "fit")
    assert type(rebuilt) is ForwardingLoader and rebuilt.tag == "mine"
    assert batches(rebuilt) == [[1, 2], [4, 5]]


def test_loader_subclass_without_batch_sampler_argument_is_refused_clearly():
    with pytest.raises(ConfigurationError) as info:
        inject_distributed_sampler(FixedBatches(Numbers(4)), 2, 0, "fit")
    text = str(info.value)
    assert "FixedBatches" in text and "takes no 'batch_sampler' argument" in text
    assert "use_distributed_sampler=False" in text and "\n" not in text


def test_a_sampler_without_length_is_refused_clearly():
    class Endless(Sampler[int]):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ConfigurationError) as info:
        inject_distributed_sampler(DataLoader(Numbers(4), sampler=Endless(), batch_size=2), 2, 0, "fit")
    text = str(info.value)
    assert "Endless" in text and "__len__" in text and "use_distributed_sampler=False" in text and "\n" not in text


def test_set_sampler_epoch_calls_each_sampler_once():

    default = inject_distributed_sampler(DataLoader(Numbers(8), batch_size=2, shuffle=True), 2, 0, "fit")
    set_sampler_epoch(default, 4)
    assert isinstance(default.sampler, DistributedSampler) and default.sampler.epoch == 4
    user = EpochBatches(8, 3)
    set_sampler_epoch(DataLoader(Numbers(8), batch_sampler=user), 2)  # one process: the loader as the user made it
    assert user.epochs == [2]
    dealt_out = inject_distributed_sampler(DataLoader(Numbers(8), batch_sampler=user), 2, 1, "fit")
    set_sampler_epoch(dealt_out, 5)
    assert dealt_out.batch_sampler.epoch == 5 and user.epochs == [2, 5]  # told once, through the ShardedSampler


def test_trainer_and_fleet_tell_a_users_batch_sampler_each_epoch():
    import torchfleet as tf
    from tests.helpers import quiet

    class Tiny(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, batch_idx):
            return (self.w - batch.float().mean()) ** 2

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    user = EpochBatches(6, 4)
    Trainer(max_epochs=3, **quiet(accelerator="cpu")).fit(Tiny(), DataLoader(Numbers(6), batch_sampler=user))
    assert user.epochs == [0, 1, 2]
    user = EpochBatches(6, 4)
    loader = Fleet(accelerator="cpu", devices=1).setup_dataloaders(DataLoader(Numbers(6), batch_sampler=user))
    for epoch in range(2):
        loader.set_epoch(epoch)
    assert user.epochs == [0, 1]


def test_even_shards_pads_a_dealt_out_evaluation_sampler():
    make = lambda: DataLoader(Numbers(20), sampler=SubsetRandomSampler(IDS), batch_size=2)  # noqa: E731
    loaders = [even_shards(inject_distributed_sampler(make(), 2, r, "validate"), 2, r) for r in (0, 1)]
    assert [(repeated, size) for _, repeated, size in loaders] == [(1, 11), (1, 11)]
    parts = []
    for loader, _, _ in loaders:
        torch.manual_seed(0)  # as seed_everything(0) on every rank: the ranks draw alike
        parts.append([i for b in batches(loader) for i in b])
    assert len(parts[0]) == len(parts[1]) == 6 and set(parts[0] + parts[1]) == set(IDS)
    even = inject_distributed_sampler(DataLoader(Numbers(20), sampler=SubsetRandomSampler(IDS[:10])), 2, 0, "test")
    assert even_shards(even, 2, 0) == (even, 0, 10)  # divides evenly: unchanged


def test_even_shards_pads_the_default_evaluation_sampler():
    make = lambda: DataLoader(Numbers(11), batch_size=2)  # noqa: E731
    loaders = [even_shards(inject_distributed_sampler(make(), 2, r, "test"), 2, r) for r in (0, 1)]
    assert [(repeated, size) for _, repeated, size in loaders] == [(1, 11), (1, 11)]
    parts = [[i for b in batches(loader) for i in b] for loader, _, _ in loaders]
    assert parts == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 0]]
