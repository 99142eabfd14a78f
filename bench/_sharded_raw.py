"""The baselines of bench/sharded.py and bench/memory.py: the engines driven by hand (no torchfleet).

    OMP_NUM_THREADS=1 torchrun --nproc-per-node=2 bench/_sharded_raw.py raw_fsdp --width 256 --blocks 8 \
        --seq 64 --batch 4 --steps 60 --warmup 10 --out raw.json

Variants:
  raw_fsdp                 init_process_group("gloo"), ``fully_shard`` on every block then the root (FSDP2,
                           FULL_SHARD), torch.optim.Adam over the sharded parameters;
  raw_fsdp_cpu_offload     the same with ``offload_policy=CPUOffloadPolicy(pin_memory=False)``;
  raw_deepspeed_stage_N    ``deepspeed.init_distributed("gloo")``, ``deepspeed.initialize`` with the
                           model, a torch.optim.Adam and a config written by hand: micro batch size,
                           ``zero_optimization`` stage N (1, 2 or 3) with torchfleet's default bucket and
                           overlap settings (``--ds-config minimal``: the stage only, DeepSpeed's defaults);
                           ``engine.backward``/``engine.step``.
DataLoader + DistributedSampler (shuffled, seed 0, set_epoch per epoch), mean squared error; results
as described in _sharded_common.py (``--memory``: the memory protocol of MemoryRun).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from _sharded_common import (
    MemoryRun,
    ShardedClock,
    dataset,
    extensions_dir,
    loss_fn,
    make_model,
    mark_rss_before_model,
    param_checksum,
    param_count,
    parse_args,
    since_launch,
)
from torch.utils.data import DataLoader, DistributedSampler

torch.set_num_threads(1)
_IMPORTED = time.time()
VARIANTS = ["raw_fsdp", "raw_fsdp_cpu_offload", "raw_deepspeed_stage_1", "raw_deepspeed_stage_2",
            "raw_deepspeed_stage_3"]


def deepspeed_config(args, stage: int) -> dict:
    """The config of a hand-written ZeRO run.

    ``--ds-config matched`` (default): the ZeRO settings torchfleet's DeepSpeedStrategy uses by default
    (those of Lightning's DeepSpeedStrategy), written out here by hand, so that a comparison measures the
    framework rather than a choice of buckets; ``minimal``: only the stage, everything else DeepSpeed's
    defaults (500M-element buckets; overlap_comm off for stages 1-2).
    """
    zero: dict = {"stage": stage}
    if args.ds_config == "matched":
        zero.update(contiguous_gradients=True, overlap_comm=True, allgather_partitions=True, reduce_scatter=True,
                    allgather_bucket_size=200_000_000, reduce_bucket_size=200_000_000)
    return {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }


def main() -> None:
    args = parse_args(VARIANTS, raw=True)
    clock = ShardedClock(args)
    clock.marks["imported"] = since_launch(_IMPORTED)
    ds = args.variant.startswith("raw_deepspeed")
    if ds:
        extensions_dir()
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    clock.mark("process_group")
    mark_rss_before_model()
    torch.manual_seed(0)
    model = make_model(args.width, args.blocks)
    config: dict = {}
    if ds:
        config = deepspeed_config(args, int(args.variant[-1]))
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
        module = engine.module
    else:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        policy = CPUOffloadPolicy(pin_memory=False) if args.variant.endswith("offload") else OffloadPolicy()
        for block in model:
            fully_shard(block, offload_policy=policy)
        fully_shard(model, offload_policy=policy)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        engine = module = model
    data = dataset(args, world)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    clock.mark("engine_ready")
    mem = MemoryRun(args, module, rank, {"params": param_count(args.width, args.blocks), "world_size": world}) \
        if args.memory else None
    clock.start_profiler(rank)
    step, epoch, loss = 0, 0, torch.tensor(float("nan"))
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            clock.step_start()
            if mem:
                mem.step_start()
            loss = loss_fn(engine(x), y)
            if ds:
                engine.backward(loss)
                if mem:
                    mem.after_backward()
                engine.step()
            else:
                loss.backward()
                if mem:
                    mem.after_backward()
                opt.step()
            if mem:
                mem.after_step()
            if not ds:
                opt.zero_grad(set_to_none=True)
            if mem:
                mem.step_end()
            clock.step_end()
            step += 1
            if step == args.steps:
                break
        epoch += 1
    checksum = param_checksum(module)
    if mem:
        mem.finish({"checksum": checksum})
    clock.finish_sharded(rank, checksum, float(loss.detach()), {"config": config})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
