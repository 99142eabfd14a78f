"""ParallelStrategy's collectives and synced logging across 2 real processes over gloo."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchfleet.environments import find_free_port
from torchfleet.environments.base import ClusterEnvironment
from torchfleet.strategies import ParallelStrategy

pytestmark = pytest.mark.distributed


class FixedEnvironment(ClusterEnvironment):
    """A two-process world started by the test itself."""

    def __init__(self, rank: int, world: int, port: int) -> None:
        self.rank, self.world, self.port = rank, world, port

    creates_processes_externally = True
    main_address = "127.0.0.1"

    @property
    def main_port(self) -> int:
        return self.port

    @staticmethod
    def detect() -> bool:
        return False

    def world_size(self) -> int:
        return self.world

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        return self.rank

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return self.rank

    def node_rank(self) -> int:
        return 0


class PlainParallel(ParallelStrategy):
    """The collective layer of ParallelStrategy, without any model wrapping."""


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        s = PlainParallel(parallel_devices=[torch.device("cpu")] * world, cluster_environment=FixedEnvironment(rank, world, port))
        from torchfleet.trainer.logging import LoggedValue, sync_epoch, sync_values

        results = {
            "mean": s.reduce(torch.tensor(float(rank + 1))),  # (1 + 2) / 2
            "sum": s.reduce(torch.tensor(float(rank + 1)), reduce_op="sum"),
            "max": s.reduce(torch.tensor(float(rank + 1)), reduce_op=dist.ReduceOp.MAX),  # Lightning accepts torch's ops
            "min": s.reduce(torch.tensor(float(rank + 1)), None, "min"),
            "gather": s.all_gather(torch.tensor([rank, rank * 10])),
            "broadcast": s.broadcast({"from": rank}, src=1),
            "all_true": s.reduce_boolean_decision(rank == 0, all=True),
            "any_true": s.reduce_boolean_decision(rank == 0, all=False),
            "world": s.world_size,
            "rank": s.global_rank,
        }
        # three sync_dist values, two reduce ops: two collectives in all
        calls = []
        original = s.reduce
        s.reduce = lambda t, group=None, reduce_op="mean": calls.append(reduce_op) or original(t, group, reduce_op)
        results["synced"] = sync_values(s, [(torch.tensor(1.0 + rank), "mean", True), (torch.tensor(5.0 * rank), "max", True),
                                            (torch.tensor(2.0 + rank), "mean", True), (torch.tensor(9.0), "sum", False)])
        results["collectives"] = list(calls)
        # epoch means are weighted by every rank's sample count: rank 0 saw 3 samples of value 1, rank 1 saw 1 of 5
        entry = LoggedValue("m", False, True, "mean", True, False, True, torch.tensor(0.0))
        if rank == 0:
            for _ in range(3):
                entry.update(torch.tensor(1.0), 1)
        else:
            entry.update(torch.tensor(5.0), 1)
        results["epoch_mean"] = sync_epoch(s, [entry])[0]
        s.barrier()
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_collectives_and_synced_logging_two_processes(tmp_path):
    port = find_free_port()
    mp.start_processes(_worker, args=(2, port, str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in range(2):
        r = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert r["world"] == 2 and r["rank"] == rank
        assert r["mean"].item() == 1.5 and r["sum"].item() == 3 and r["max"].item() == 2 and r["min"].item() == 1
        assert r["gather"].tolist() == [[0, 0], [1, 10]]
        assert r["broadcast"] == {"from": 1}
        assert r["all_true"] is False and r["any_true"] is True
        assert [round(v.item(), 4) for v in r["synced"]] == [1.5, 5.0, 2.5, 9.0]
        assert sorted(r["collectives"]) == ["max", "mean"]
        assert r["epoch_mean"].item() == pytest.approx((3 * 1.0 + 5.0) / 4)
