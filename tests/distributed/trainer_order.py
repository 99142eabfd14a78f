"""The order a ddp Trainer reads a ``shuffle=False`` training loader in, for one-process references.

As Lightning's Trainer, torchfleet's gives every training loader of a multi-process run a
``DistributedSampler(shuffle=True, seed=<global seed>)``, reshuffled each epoch (``set_epoch``). A reference
that runs in one process with the global batch must therefore see, at each step, the union of what the ranks
read at that step: ``TrainerOrder`` is that batch sampler.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import DistributedSampler, Sampler, SequentialSampler


def trainer_batches(n_samples: int, world_size: int, per_rank_batch: int, seed: int = 0,
                    epoch: int = 0) -> list[list[int]]:
    """Each step's global batch (rank 0's samples, then rank 1's, ...) in epoch ``epoch``."""
    ranks = []
    for rank in range(world_size):
        sampler = DistributedSampler(range(n_samples), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        order = list(sampler)
        ranks.append([order[i:i + per_rank_batch] for i in range(0, len(order), per_rank_batch)])
    return [sum(step, []) for step in zip(*ranks)]


class TrainerOrder(Sampler[list[int]]):
    """A batch sampler giving one process the global batches of a ddp Trainer run, epoch by epoch."""

    def __init__(self, n_samples: int, world_size: int, per_rank_batch: int, seed: int = 0) -> None:
        self.args = (n_samples, world_size, per_rank_batch, seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        return iter(trainer_batches(*self.args, epoch=self.epoch))

    def __len__(self) -> int:
        return len(trainer_batches(*self.args))


class InOrder(SequentialSampler):
    """A sampler of the program's own that reads the data in order.

    The Trainer shuffles only the default sampler (as Lightning's); a sampler of one's own it deals out to the
    ranks as it is (rank r takes items r, r + world size, ...), so each step's global batch is the same at any
    world size: what tests of checkpoints that move between world sizes need.
    """
