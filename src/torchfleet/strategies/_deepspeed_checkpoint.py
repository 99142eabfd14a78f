"""DeepSpeedStrategy's checkpoints through its engine: saving with the engine, loading into it at any world size.

The "deepspeed" directory layout, its reading in one process and consolidation are
torchfleet.checkpoint.deepspeed's. Here the live engine is involved: it writes its partition files,
reloads its own checkpoint at the world size and stage that wrote it, and otherwise receives the
consolidated weights and the whole optimizer state (torchfleet.checkpoint.zero) into its partitions.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from torchfleet.checkpoint.deepspeed import (
    DEEPSPEED_SUBDIR,
    consolidated_weights,
    deepspeed_info,
    engine_entry,
    quiet_deepspeed,
    read_full_optimizer,
    save_deepspeed_checkpoint,
)
from torchfleet.checkpoint.distributed import Ranks
from torchfleet.checkpoint.state import load_state_dict_checked
from torchfleet.checkpoint.zero import check_engine_files
from torchfleet.errors import CheckpointError
from torchfleet.strategies._zero_state import load_into_engine


class EngineStrategy(Ranks, Protocol):
    """What these functions read of DeepSpeedStrategy (a Protocol, so that deepspeed.py alone imports this module)."""

    _half: str | None
    optimizer_param_names: list[list[str | None]] | None

    @property
    def engine(self) -> Any: ...
    @property
    def zero_stage(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    def unwrap(self, module: nn.Module) -> nn.Module: ...

log = logging.getLogger(__name__)


def save_deepspeed(strategy: EngineStrategy, path: str | os.PathLike, plain: Mapping[str, Any]) -> None:
    """Write ``plain`` (modules and optimizers already placeholders) as a "deepspeed" layout directory at ``path``."""
    engine_info = {
        "world_size": strategy.world_size,
        "zero_stage": strategy.zero_stage,
        "half": strategy._half,
        # how the user's optimizer numbered its parameters, so that consolidation can number them the same way
        "param_names": strategy.optimizer_param_names,
    }
    save_deepspeed_checkpoint(path, plain, strategy, engine_info, save_engine=strategy.engine.save_checkpoint)


# ---------------------------------------------------------------------------- loading into an engine
def load_engine_checkpoint(
    strategy: EngineStrategy, checkpoint: Mapping[str, Any], with_optimizer: bool, strict: bool = True
) -> None:
    """Load the engine checkpoint behind ``checkpoint`` into ``strategy.engine``.

    Weights only (no optimizer to restore): the consolidated float32 weights, at any world size and
    stage. With the optimizer: DeepSpeed's own load at the same world size and stage; otherwise the
    ZeRO files are read whole (any torch optimizer) and placed into this engine's partitions.
    """
    entry = engine_entry(checkpoint)
    path, weights_only = str(entry.path), entry.weights_only
    info = deepspeed_info(checkpoint, path)
    engine = strategy.engine
    if not with_optimizer or engine.optimizer is None:
        load_full_weights(strategy, strategy.unwrap(engine), consolidated_weights(path, info, weights_only), strict=strict)
        return
    saved_stage, stage = int(info["zero_stage"]), strategy.zero_stage
    saved_ws, ws = int(info["world_size"]), strategy.world_size
    ds_dir = os.path.join(path, DEEPSPEED_SUBDIR)
    if saved_stage == stage and (saved_ws == ws or stage == 0):
        # DeepSpeed unpickles its files with weights_only=False: they pass the safe loader first
        check_engine_files(os.path.join(ds_dir, info["tag"]), weights_only)
        with quiet_deepspeed():
            loaded, _ = engine.load_checkpoint(ds_dir, tag=info["tag"], load_module_strict=strict,
                                               load_optimizer_states=True, load_lr_scheduler_states=False)
        if loaded is None:
            raise CheckpointError(f"DeepSpeed found no checkpoint tagged {info['tag']!r} under {ds_dir!r}.")
        return
    if saved_stage == 0:
        raise CheckpointError(
            f"{path!r} was written without ZeRO (stage 0) and this run uses ZeRO stage {stage}. A stage-0 checkpoint "
            "resumes under stage 0 (any world size); for ZeRO, or to move it anywhere else, write it as one file "
            "first: `torchfleet consolidate CKPT OUT --with-optimizer` resumes under ddp, fsdp or single_device."
        )
    log.info("Resuming %s (ZeRO-%d on %d processes) with ZeRO-%d on %d processes: placing its whole optimizer "
             "state into this engine's partitions", path, saved_stage, saved_ws, stage, ws)
    full = read_full_optimizer(path, info, weights_only)
    load_full_weights(strategy, strategy.unwrap(engine), consolidated_weights(path, info, weights_only), strict=strict)
    load_into_engine(engine, full, path)


# ---------------------------------------------------------------------------- full weights
def load_full_weights(strategy: EngineStrategy, module: nn.Module, state: Mapping[str, Any], strict: bool = True) -> None:
    """Load full (unsharded) weights into the engine's user module, at any stage, then refresh ZeRO's float32 masters."""
    engine = strategy.engine
    if strategy.zero_stage == 3 and engine is not None:
        _load_into_partitioned(strategy, module, state, strict)
    else:
        load_state_dict_checked(module, state, strict=strict)
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is not None and hasattr(optimizer, "refresh_fp32_params"):
        # ZeRO steps a float32 copy of the weights: without this, the next step would bring the old ones back
        optimizer.refresh_fp32_params()


def _full_shape(t: Tensor) -> tuple[int, ...]:
    shape = getattr(t, "ds_shape", None)  # a ZeRO-3 parameter: its data is this rank's partition
    return tuple(shape) if shape is not None else tuple(t.shape)


def _load_into_partitioned(strategy: EngineStrategy, module: nn.Module, state: Mapping[str, Any], strict: bool) -> None:
    import deepspeed

    own = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    problems = []
    if strict:
        missing = [k for k in own if k not in state and not _is_non_persistent_buffer(module, k)]
        unexpected = [k for k in state if k not in own]
        if missing:
            problems.append(f"missing from the checkpoint: {', '.join(map(repr, missing[:5]))}")
        if unexpected:
            problems.append(f"in the checkpoint but not in the model: {', '.join(map(repr, unexpected[:5]))}")
    shapes = [f"{k!r} (checkpoint {tuple(v.shape)}, model {_full_shape(own[k])})"
              for k, v in state.items() if k in own and isinstance(v, Tensor) and tuple(v.shape) != _full_shape(own[k])]
    if shapes:
        problems.append("shape differs for " + ", ".join(shapes[:5]))
    if problems:
        raise CheckpointError(
            f"The checkpoint's weights do not fit {type(module).__name__}: {'; '.join(problems)}. The model's "
            "architecture or its hyperparameters differ from the run that wrote the checkpoint; build the model "
            "with the same arguments, or load with strict=False to skip missing and extra keys."
        )
    rank0 = strategy.is_global_zero
    for prefix, sub in module.named_modules():
        dot = f"{prefix}." if prefix else ""
        params = list(sub.parameters(recurse=False))
        if params:
            # gathered one module at a time, so the full model never has to fit in one process
            with deepspeed.zero.GatheredParameters(params, modifier_rank=0), torch.no_grad():
                if rank0:
                    for name, p in sub.named_parameters(recurse=False):
                        if dot + name in state:
                            p.data.copy_(state[dot + name])
        with torch.no_grad():
            for name, b in sub.named_buffers(recurse=False):
                if dot + name in state:
                    b.copy_(state[dot + name])


def _is_non_persistent_buffer(module: nn.Module, name: str) -> bool:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    return leaf in getattr(owner, "_non_persistent_buffers_set", set())
