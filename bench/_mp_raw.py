"""The baselines of bench/model_parallel.py: the example's Transformer trained by hand (no torchfleet Trainer,
strategy or launcher), as torchtitan's loop does it:

    OMP_NUM_THREADS=1 torchrun --nproc-per-node=4 bench/_mp_raw.py raw_tp2dp2 --out raw.json

  raw_ddp     init_process_group("gloo"), DistributedDataParallel;
  raw_fsdp    ``fully_shard`` on every block, then the model, over a 1-D mesh of every rank;
  raw_tp2dp2  ``init_device_mesh`` ("data_parallel", "tensor_parallel") = (2, 2), the example's ``parallelize``
              (tensor, sequence and loss parallel, then FSDP2 over "data_parallel"), the cross-entropy and its
              backward under ``loss_parallel()``;
  raw_pp2dp2  ``init_device_mesh`` ("pipeline_parallel", "data_parallel") = (2, 2): each rank deletes the other
              stage's children of ``gpt_sequential`` (the example's GPT as one Sequential), ``fully_shard`` on
              the stage's blocks then the stage over "data_parallel", a ``PipelineStage`` and ``Schedule1F1B``
              over 2 microbatches of the rank's batch (the loss per microbatch on the last stage).
DataLoader + DistributedSampler over the data-parallel ranks, in order; AdamW. The model class and
``parallelize`` come from the example module (importing it imports the torchfleet package; none of its code
runs in the loop).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _mp_common import (
    MICROBATCHES,
    StepClock,
    config,
    data,
    gpt_sequential,
    mesh_shape,
    parse_args,
    pipeline_size,
    split_point,
    token_loss,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from torchfleet.examples.tp_transformer import GPT, parallelize

torch.set_num_threads(1)


def pipelined(args) -> None:
    """raw_pp2dp2: this rank's stage of the Sequential GPT, FSDP2 over the data-parallel ranks, 1F1B."""
    world, pp = dist.get_world_size(), pipeline_size(args.variant)
    dp = world // pp
    mesh = init_device_mesh("cpu", (pp, dp), mesh_dim_names=("pipeline_parallel", "data_parallel"))
    stage_index = mesh.get_local_rank("pipeline_parallel")
    model = gpt_sequential(config(args))
    names = list(model._modules)
    start = names.index(split_point(config(args)))
    for name in names[start:] if stage_index == 0 else names[:start]:
        delattr(model, name)  # the other stage's layers; the kept ones keep their names
    for name, child in model.named_children():
        if name.startswith("block"):
            fully_shard(child, mesh=mesh["data_parallel"])
    fully_shard(model, mesh=mesh["data_parallel"])
    stage = PipelineStage(model, stage_index, pp, torch.device("cpu"), group=mesh.get_group("pipeline_parallel"))
    schedule = Schedule1F1B(stage, MICROBATCHES, loss_fn=token_loss)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    dataset = data(args)
    sampler = DistributedSampler(dataset, num_replicas=dp, rank=mesh.get_local_rank("data_parallel"), shuffle=False)
    clock = StepClock(args)
    for tokens, targets in DataLoader(dataset, batch_size=args.global_batch // dp, sampler=sampler):
        if stage_index == 0:
            schedule.step(tokens)
        else:  # the last stage (pp = 2): the loss of each microbatch
            schedule.step(target=targets, losses=[])
        optimizer.step()
        optimizer.zero_grad()
        clock.step_end()
    clock.finish(model, optimizer, stages=pp)


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    if pipeline_size(args.variant) > 1:
        pipelined(args)
        return
    world = dist.get_world_size()
    dp, tp = mesh_shape(args.variant, world)
    torch.manual_seed(0)
    model = GPT(config(args))
    if args.variant == "raw_ddp":
        model = DistributedDataParallel(model)
    elif args.variant == "raw_fsdp":
        mesh = init_device_mesh("cpu", (world,))
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = parallelize(model, init_device_mesh("cpu", (dp, tp), mesh_dim_names=("data_parallel",
                                                                                    "tensor_parallel")))
    context = loss_parallel if tp > 1 else contextlib.nullcontext
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    dataset = data(args)
    sampler = DistributedSampler(dataset, num_replicas=dp, rank=dist.get_rank() // tp, shuffle=False)
    clock = StepClock(args)
    for tokens, targets in DataLoader(dataset, batch_size=args.global_batch // dp, sampler=sampler):
        logits = model(tokens)
        with context():
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        clock.step_end()
    clock.finish(model, optimizer)
    # no destroy_process_group: in one torchrun run rank 0 hung in it after the others had exited; exiting ends the group


if __name__ == "__main__":
    main()
