"""The baseline of bench/ddp.py: a plain torch.distributed + DistributedDataParallel loop (no torchfleet).

    OMP_NUM_THREADS=1 torchrun --nproc-per-node=2 bench/_ddp_raw.py raw --widths 32,64,10 --batch 32 \
        --steps 2000 --warmup 50 --out raw.json

DataLoader + DistributedSampler, SGD, mean cross-entropy; results as described in _ddp_common.py.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _ddp_common import Clock, dataset, mlp, parse_args, since_launch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

torch.set_num_threads(1)
_IMPORTED = time.time()


def main() -> None:
    args = parse_args(["raw"])
    clock = Clock(args)
    clock.marks["imported"] = since_launch(_IMPORTED)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    clock.mark("process_group")
    torch.manual_seed(0)
    model = DistributedDataParallel(mlp(args.widths))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = dataset(args.widths, args.batch, args.batches_per_epoch, world)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    clock.mark("ddp_ready")
    clock.start_profiler(rank)
    step, epoch, loss = 0, 0, torch.tensor(float("nan"))
    while step < args.steps:
        sampler.set_epoch(epoch)
        if clock.timers is not None:
            step, loss = timed_epoch(loader, model, opt, clock, step, args.steps, loss)
        else:
            for x, y in loader:
                clock.step_start()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                clock.step_end()
                step += 1
                if step == args.steps:
                    break
        epoch += 1
    clock.finish(rank, model.module, float(loss.detach()))
    dist.destroy_process_group()


def timed_epoch(loader, model, opt, clock, step, steps, loss):
    """The same epoch with perf_counter around each piece (``--timers``, a diagnostic run)."""
    perf = time.perf_counter
    batches = iter(loader)
    while step < steps:
        a = perf()
        batch = next(batches, None)
        if batch is None:
            break
        clock.step_start()
        x, y = batch
        b = perf()
        loss = F.cross_entropy(model(x), y)
        c = perf()
        loss.backward()
        d = perf()
        opt.step()
        opt.zero_grad(set_to_none=True)
        e = perf()
        clock.add("fetch batch", b - a)  # before step_end, like torchfleet's: only steps after the warm-up count
        clock.add("forward (DDP)", c - b)
        clock.add("backward (+all-reduce)", d - c)
        clock.add("opt.step + zero_grad", e - d)
        clock.step_end()
        step += 1
    return step, loss


if __name__ == "__main__":
    main()
