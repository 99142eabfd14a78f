"""Whole per-parameter tensors (weights and optimizer state) written into a live DeepSpeed engine's ZeRO partitions.

The tensors come from torchfleet.checkpoint.zero, which reads a ZeRO checkpoint of any world size
and stage; this places them into the partitions this rank owns in the engine it runs now, whatever
world size and stage that is. See torchfleet.checkpoint.zero for the two partition layouts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from torchfleet.checkpoint.zero import FullOptimizerState, copy_scalars, strip_wrapper
from torchfleet.errors import CheckpointError


@dataclass
class _Target:
    """One flat of the live engine on this rank and which part of which parameter each stretch of it holds."""

    flat: Tensor
    group: int
    #: (parameter name, start in the flattened parameter, length, start in the flat)
    pieces: list[tuple[str, int, int, int]]


def _rank_in(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0


def _stage12_targets(opt: Any, names: Mapping[int, str]) -> list[_Target]:
    targets = []
    for g, params in enumerate(opt.round_robin_bit16_groups):
        flat = opt.single_partition_of_fp32_groups[g]
        size = flat.numel()
        low = _rank_in(opt.real_dp_process_group[g]) * size
        pieces, cursor = [], 0
        for p, pad in zip(params, opt.round_robin_bit16_padding[g]):
            n = p.numel()
            start, end = max(cursor, low), min(cursor + n, low + size)
            if start < end:
                pieces.append((names[id(p)], start - cursor, end - start, start - low))
            cursor += n + int(pad)
        targets.append(_Target(flat, g, pieces))
    return targets


def _stage3_targets(opt: Any, names: Mapping[int, str]) -> list[_Target]:
    rank = _rank_in(opt.dp_process_group)
    targets = []
    for i, params in enumerate(opt.fp16_groups):
        pieces, offset = [], 0
        for p in params:
            piece, n = p.partition_numel(), p.ds_numel
            length = max(0, min(piece, n - rank * piece))
            if length:
                pieces.append((names[id(p)], rank * piece, length, offset))
            offset += piece
        targets.append(_Target(opt.fp32_partitioned_groups_flat[i], opt.sub_group_to_group_id[i], pieces))
    return targets


def _fill(flat: Tensor, pieces: Sequence[tuple[str, int, int, int]], values: Mapping[str, Tensor]) -> Tensor:
    out = torch.zeros(flat.numel(), dtype=flat.dtype, device=flat.device)
    for name, start, length, at in pieces:
        out[at:at + length] = values[name].reshape(-1)[start:start + length]
    return out


def load_into_engine(engine: Any, full: FullOptimizerState, where: str) -> None:
    """Write ``full`` (weights and optimizer state) into ``engine``'s partitions on this rank (any stage, world size).

    The engine's module must already hold the weights (the 16-bit copy, when training in 16 bits):
    this sets the float32 masters and every optimizer-state key of the flats this rank owns.
    """
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    opt = engine.optimizer
    names = {id(p): strip_wrapper(n) for n, p in engine.module.named_parameters()}
    if isinstance(opt, DeepSpeedZeroOptimizer_Stage3) and not getattr(opt, "swap_optimizer", False):
        targets = _stage3_targets(opt, names)
    elif isinstance(opt, DeepSpeedZeroOptimizer):
        targets = _stage12_targets(opt, names)
    elif isinstance(opt, torch.optim.Optimizer):
        # no ZeRO and no 16-bit wrapper (DeepSpeed's wrappers are not torch optimizers): DeepSpeed steps the user's optimizer over the module's own parameters
        order = [[names.get(id(p)) for p in g["params"]] for g in opt.param_groups]
        opt.load_state_dict(full.to_torch(order))
        _set_counters(engine, full)
        return
    else:
        raise CheckpointError(
            f"{where!r} holds optimizer state that torchfleet can place into ZeRO stage 0-3 engines (also with CPU "
            f"offload of the optimizer), but this engine runs {type(opt).__name__} (NVMe-swapped or 16-bit stage-0 "
            "optimizer state). Resume with the world size and stage that wrote the checkpoint, or resume from "
            "`torchfleet consolidate CKPT OUT --with-optimizer` under ddp, fsdp or single_device."
        )
    wanted = {name for t in targets for name, *_ in t.pieces}
    missing = sorted(wanted - set(full.state))
    if missing:
        raise CheckpointError(
            f"{where!r} has no optimizer state for {', '.join(map(repr, missing[:5]))}: the model trains parameters "
            "the run that wrote the checkpoint did not. Build the model and its optimizer as that run did, or load "
            "the weights alone (validate/test/predict, or fit without ckpt_path after load_from_checkpoint)."
        )
    base = opt.optimizer
    if len(base.param_groups) != len(full.hyperparameters):
        raise CheckpointError(
            f"{where!r} was written with {len(full.hyperparameters)} optimizer param groups and this optimizer has "
            f"{len(base.param_groups)}. configure_optimizers must build the same groups to resume."
        )
    for group, hyper in zip(base.param_groups, full.hyperparameters):
        group.update(hyper)
    weights = full.weights
    keys = {k for s in full.state.values() for k, v in s.items() if isinstance(v, Tensor) and v.dim() > 0}
    with torch.no_grad():
        for t in targets:
            t.flat.copy_(_fill(t.flat, t.pieces, weights))
            state = base.state[t.flat]
            for key in keys:
                value = _fill(t.flat, t.pieces, {n: full.state[n][key] for n, *_ in t.pieces})
                if isinstance(state.get(key), Tensor) and state[key].shape == value.shape:
                    state[key].copy_(value)  # DeepSpeed's fragment views of the old tensor stay valid
                else:
                    state[key] = value
            if t.pieces:
                first = full.state[t.pieces[0][0]]
                state.update(copy_scalars({k: v for k, v in first.items() if k not in keys}))
    _set_counters(engine, full)


def _set_counters(engine: Any, full: FullOptimizerState) -> None:
    for key, value in full.counters.items():
        if hasattr(engine, key):
            setattr(engine, key, value)
