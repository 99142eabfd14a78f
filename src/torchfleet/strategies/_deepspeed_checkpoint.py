"""DeepSpeedStrategy's checkpoints: the "deepspeed" directory layout, resuming at any world size, consolidation.

A checkpoint directory holds DeepSpeed's engine checkpoint under ``deepspeed/<tag>/`` and our
``torchfleet.pt`` (written by torchfleet.checkpoint.distributed.write_meta) with everything else,
including a ``"deepspeed"`` entry: the world size and ZeRO stage it was written with, its tag, and
which checkpoint entries (modules, optimizers) the engine checkpoint stands for.

DeepSpeed reloads its own checkpoint only with the world size and stage that wrote it. Otherwise we
read its ZeRO partitions whole (strategies/_zero_state.py: any torch optimizer, every state key)
and place weights and optimizer state into the new engine's partitions ourselves. The same reader
gives ``consolidate`` its optimizer state in torch.optim form.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from torchfleet.checkpoint.format import FORMAT_KEY, FORMAT_VERSION
from torchfleet.errors import CheckpointError
from torchfleet.strategies._zero_state import FullOptimizerState, has_zero_files, strip_wrapper
from torchfleet.strategies.deepspeed import (
    _UNIVERSAL_INFO,
    CHECKPOINT_TAG,
    DEEPSPEED_SUBDIR,
    META_DEEPSPEED_KEY,
    _InEngine,
    import_deepspeed,
)

if TYPE_CHECKING:
    from torchfleet.strategies.deepspeed import DeepSpeedStrategy

log = logging.getLogger(__name__)

_MODEL_STATES = "mp_rank_00_model_states.pt"


# ---------------------------------------------------------------------------- layout
def is_deepspeed_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a complete sharded checkpoint directory of the "deepspeed" layout."""
    from torchfleet.checkpoint.distributed import checkpoint_layout, is_sharded_checkpoint

    return is_sharded_checkpoint(path) and checkpoint_layout(path) == "deepspeed"


def _is_optimizer_marker(value: Any) -> bool:
    if isinstance(value, _InEngine):
        return value.kind == "optimizer"
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, _InEngine) and v.kind == "optimizer" for v in value)


def save_deepspeed(strategy: DeepSpeedStrategy, path: str | os.PathLike, plain: Mapping[str, Any]) -> None:
    """Write ``plain`` (modules and optimizers already placeholders) as a "deepspeed" layout directory at ``path``."""
    from torchfleet.checkpoint.distributed import atomic_checkpoint_dir, sharded_marker, write_meta

    modules = [k for k, v in plain.items() if isinstance(v, _InEngine) and v.kind == "module"]
    optimizers = {k: (len(v) if isinstance(v, list) else None) for k, v in plain.items() if _is_optimizer_marker(v)}
    meta = {k: v for k, v in plain.items() if k not in modules and k not in optimizers}
    meta[FORMAT_KEY] = sharded_marker("deepspeed")
    meta[META_DEEPSPEED_KEY] = {
        "tag": CHECKPOINT_TAG,
        "world_size": strategy.world_size,
        "zero_stage": strategy.zero_stage,
        "half": strategy._half,
        "modules": modules,
        "optimizers": optimizers,
        # how the user's optimizer numbered its parameters, so that consolidation can number them the same way
        "param_names": strategy.optimizer_param_names,
    }
    with atomic_checkpoint_dir(path, strategy) as tmp:
        # every rank writes its own partition files; DeepSpeed synchronises the ranks inside
        strategy.engine.save_checkpoint(os.path.join(tmp, DEEPSPEED_SUBDIR), tag=CHECKPOINT_TAG,
                                        client_state=dict(_UNIVERSAL_INFO))
        if strategy.is_global_zero:
            write_meta(tmp, meta)


def _deepspeed_info(meta: Mapping[str, Any], path: Any) -> dict[str, Any]:
    info = meta.get(META_DEEPSPEED_KEY)
    if not isinstance(info, Mapping) or "tag" not in info:
        raise CheckpointError(
            f"{os.fspath(path)!r} is marked as a DeepSpeed checkpoint but its {META_DEEPSPEED_KEY!r} entry, which says "
            "how the engine checkpoint was written, is missing. The checkpoint was not written by DeepSpeedStrategy; "
            "resume from one that was."
        )
    return dict(info)


def read_deepspeed_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint dict of a "deepspeed" directory: its meta, with placeholders for what the engine checkpoint holds."""
    from torchfleet.checkpoint.distributed import read_meta

    meta = read_meta(path)
    info = _deepspeed_info(meta, path)
    checkpoint = dict(meta)
    where = os.fspath(path)
    for key in info.get("modules", []):
        checkpoint[key] = _InEngine("module", where)
    for key, count in info.get("optimizers", {}).items():
        checkpoint[key] = _InEngine("optimizer", where) if count is None else [
            _InEngine("optimizer", where) for _ in range(count)]
    return checkpoint


# ---------------------------------------------------------------------------- loading into an engine
def _checkpoint_path(checkpoint: Mapping[str, Any]) -> str:
    for value in checkpoint.values():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, _InEngine) and v.path is not None:
                return v.path
    raise CheckpointError("The checkpoint dict does not say which DeepSpeed checkpoint directory it came from.")


def load_engine_checkpoint(
    strategy: DeepSpeedStrategy, checkpoint: Mapping[str, Any], with_optimizer: bool, strict: bool = True
) -> None:
    """Load the engine checkpoint behind ``checkpoint`` into ``strategy.engine``.

    Weights only (no optimizer to restore): the consolidated float32 weights, at any world size and
    stage. With the optimizer: DeepSpeed's own load at the same world size and stage; otherwise the
    ZeRO files are read whole (any torch optimizer) and placed into this engine's partitions.
    """
    path = _checkpoint_path(checkpoint)
    info = _deepspeed_info(checkpoint, path)
    engine = strategy.engine
    if not with_optimizer or engine.optimizer is None:
        load_full_weights(strategy, strategy.unwrap(engine), consolidated_weights(path, info), strict=strict)
        return
    saved_stage, stage = int(info["zero_stage"]), strategy.zero_stage
    saved_ws, ws = int(info["world_size"]), strategy.world_size
    ds_dir = os.path.join(path, DEEPSPEED_SUBDIR)
    if saved_stage == stage and (saved_ws == ws or stage == 0):
        with _quiet():
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
    from torchfleet.strategies._zero_state import load_into_engine

    full = read_full_optimizer(path, info)
    load_full_weights(strategy, strategy.unwrap(engine), consolidated_weights(path, info), strict=strict)
    load_into_engine(engine, full, path)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """DeepSpeed's checkpoint tools print progress to stdout/stderr; keep it in the debug log instead."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        text = (out.getvalue() + err.getvalue()).strip()
        if text:
            log.debug("DeepSpeed said:\n%s", text)


# ---------------------------------------------------------------------------- full weights
def load_full_weights(strategy: DeepSpeedStrategy, module: nn.Module, state: Mapping[str, Any], strict: bool = True) -> None:
    """Load full (unsharded) weights into the engine's user module, at any stage, then refresh ZeRO's float32 masters."""
    engine = strategy.engine
    if strategy.zero_stage == 3 and engine is not None:
        _load_into_partitioned(strategy, module, state, strict)
    else:
        from torchfleet.checkpoint.state import load_state_dict_checked

        load_state_dict_checked(module, state, strict=strict)
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is not None and hasattr(optimizer, "refresh_fp32_params"):
        # ZeRO steps a float32 copy of the weights: without this, the next step would bring the old ones back
        optimizer.refresh_fp32_params()


def _full_shape(t: Tensor) -> tuple[int, ...]:
    shape = getattr(t, "ds_shape", None)  # a ZeRO-3 parameter: its data is this rank's partition
    return tuple(shape) if shape is not None else tuple(t.shape)


def _load_into_partitioned(strategy: DeepSpeedStrategy, module: nn.Module, state: Mapping[str, Any], strict: bool) -> None:
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


# ---------------------------------------------------------------------------- consolidation
def _strip_wrapper(state: Mapping[str, Any]) -> dict[str, Any]:
    return {strip_wrapper(k): v for k, v in state.items()}


def consolidated_weights(path: str | os.PathLike, info: Mapping[str, Any] | None = None) -> dict[str, Tensor]:
    """The float32 weights of a "deepspeed" checkpoint under the user module's names (one process, any stage)."""
    if info is None:
        from torchfleet.checkpoint.distributed import read_meta

        info = _deepspeed_info(read_meta(path), path)
    import_deepspeed("Reading a DeepSpeed checkpoint")
    ds_dir = os.path.join(os.fspath(path), DEEPSPEED_SUBDIR)
    tag_dir = os.path.join(ds_dir, info["tag"])
    if not os.path.isdir(tag_dir):
        raise CheckpointError(f"{os.fspath(path)!r} lacks the engine checkpoint {tag_dir!r}: the directory is incomplete.")
    if int(info.get("zero_stage", 0)) == 0 and not has_zero_files(tag_dir):
        # no ZeRO: the model-states file holds the whole module
        module = torch.load(os.path.join(tag_dir, _MODEL_STATES), map_location="cpu", weights_only=False)["module"]
        return {k: v.float() if v.is_floating_point() else v for k, v in _strip_wrapper(module).items()}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with _quiet():
        state = get_fp32_state_dict_from_zero_checkpoint(ds_dir, tag=info["tag"])
    return {k: v.clone() for k, v in _strip_wrapper(state).items()}


def read_full_optimizer(path: str | os.PathLike, info: Mapping[str, Any]) -> FullOptimizerState:
    """The ZeRO optimizer partitions of a "deepspeed" checkpoint, whole and per parameter (one process)."""
    from torchfleet.strategies._zero_state import read_zero_optimizer

    tag_dir = os.path.join(os.fspath(path), DEEPSPEED_SUBDIR, info["tag"])
    if not os.path.isdir(tag_dir):
        raise CheckpointError(f"{os.fspath(path)!r} lacks the engine checkpoint {tag_dir!r}: the directory is incomplete.")
    return read_zero_optimizer(tag_dir)


def consolidated_optimizer_state(path: str | os.PathLike, info: Mapping[str, Any]) -> dict[str, Any]:
    """The optimizer state of a "deepspeed" checkpoint in ``torch.optim.Optimizer.state_dict()`` form (one process).

    Any torch optimizer: every state key is mapped back onto the parameters. They are numbered as
    the user's optimizer held them (recorded at save time; frozen parameters included, without
    state), or, for checkpoints without that record, in the order ZeRO flattened them.
    """
    tag_dir = os.path.join(os.fspath(path), DEEPSPEED_SUBDIR, info["tag"])
    if int(info.get("zero_stage", 0)) == 0 and not has_zero_files(tag_dir):
        # no ZeRO: DeepSpeed saved the torch optimizer's own state dict
        return torch.load(os.path.join(tag_dir, _MODEL_STATES), map_location="cpu", weights_only=False)["optimizer"]
    return read_full_optimizer(path, info).to_torch(info.get("param_names"))


def consolidate(path: str | os.PathLike, with_optimizer: bool = False) -> dict[str, Any]:
    """A single-file torchfleet checkpoint dict from the "deepspeed" directory at ``path`` (see consolidate_deepspeed)."""
    import_deepspeed("Consolidating a DeepSpeed checkpoint")
    from torchfleet.checkpoint.distributed import read_meta

    if not is_deepspeed_checkpoint(path):
        raise CheckpointError(
            f"{os.fspath(path)!r} is not a DeepSpeed checkpoint directory (one holding a torchfleet.pt that names the "
            "'deepspeed' layout, written by DeepSpeedStrategy). Give the path of such a directory."
        )
    meta = read_meta(path)
    info = _deepspeed_info(meta, path)
    out = {k: v for k, v in meta.items() if k != META_DEEPSPEED_KEY}
    marker = dict(meta.get(FORMAT_KEY, {}))
    marker.pop("layout", None)
    marker["format"] = FORMAT_VERSION
    out[FORMAT_KEY] = marker
    weights = consolidated_weights(path, info)
    for key in info.get("modules", []):
        out[key] = weights
    optimizer = consolidated_optimizer_state(path, info) if with_optimizer else None
    for key, count in info.get("optimizers", {}).items():
        if optimizer is not None:
            out[key] = optimizer if count is None else [optimizer]
    return out
