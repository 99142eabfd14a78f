"""DeepSpeed ZeRO's checkpoint files read back as whole per-parameter tensors, for any torch optimizer.

DeepSpeed's ZeRO keeps, per rank, one flat float32 partition per parameter group (stages 1-2) or
per sub-group (stage 3) and runs the user's optimizer over those flats, so every optimizer state
that has one value per element (SGD's momentum_buffer, Adagrad's sum, RMSprop's square_avg,
Adam's exp_avg, ...) is a flat partition too. This module reads the engine checkpoint files
(``*_optim_states.pt`` per rank, plus the model-states file with ``param_shapes``) and maps every
flat back onto parameters under their saved shapes, whatever the keys are called. Writing such
whole tensors into a live engine's partitions is the strategy's (strategies/_zero_state.py).

DeepSpeed's own universal-checkpoint converter is not used: it assumes Adam's exp_avg/exp_avg_sq.

The two layouts (DeepSpeed 0.19):

- stages 1-2: a group's parameters are flattened one after another (each followed by its
  alignment padding, ``param_alignment_paddings``), the whole padded to a multiple of the world
  size and cut into equal partitions. The files hold each rank's float32 partition without the
  tail padding; the optimizer's per-element states keep it.
- stage 3: every parameter is cut into ``ceil(numel / world_size)`` pieces, one per rank (the last
  padded), and a rank's flat holds its piece of each parameter of the sub-group in turn.
"""

from __future__ import annotations

import math
import os
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from torchfleet.checkpoint import safe
from torchfleet.errors import CheckpointError

#: the engine's module is our _HookDispatch around the user's module: every name it saves starts with this
_WRAPPER_PREFIX = "module."
_OPTIM_FILE = re.compile(r"(?:^|_)zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_MODEL_FILES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
#: engine counters kept in the model-states file that a resumed engine should continue from
_COUNTERS = ("global_steps", "global_samples", "skipped_steps")


def strip_wrapper(name: str) -> str:
    """The user module's name of a parameter named by the engine."""
    return name[len(_WRAPPER_PREFIX):] if name.startswith(_WRAPPER_PREFIX) else name


@dataclass
class FullOptimizerState:
    """The optimizer state of a ZeRO checkpoint, whole, per parameter name (the user module's names).

    ``groups``: the trainable parameters of each param group in the checkpoint's order;
    ``hyperparameters``: each group's settings (lr, momentum, ...) without ``params``;
    ``state``: per parameter, every optimizer-state key: per-element ones as tensors of the
    parameter's shape, the others (``step``) as saved; ``weights``: the float32 master weights;
    ``counters``: the engine's global_steps/global_samples/skipped_steps.
    """

    groups: list[list[str]]
    hyperparameters: list[dict[str, Any]]
    state: dict[str, dict[str, Any]]
    weights: dict[str, Tensor]
    counters: dict[str, int] = field(default_factory=dict)

    def to_torch(self, order: Sequence[Sequence[str | None]] | None = None) -> dict[str, Any]:
        """``torch.optim.Optimizer.state_dict()`` form: parameters numbered group by group.

        ``order`` names the parameters of each group as the user's optimizer held them (frozen
        ones included, None for one outside the module); without it, or when it does not cover
        the checkpoint's groups, the checkpoint's own order is used.
        """
        if order is None or not _covers(order, self.groups):
            order = self.groups
        state: dict[int, dict[str, Any]] = {}
        groups, index = [], 0
        for hyper, names in zip(self.hyperparameters, order):
            ids = []
            for name in names:
                if name in self.state:
                    state[index] = dict(self.state[name])
                ids.append(index)
                index += 1
            groups.append({**hyper, "params": ids})
        return {"state": state, "param_groups": groups}


def _covers(order: Sequence[Sequence[str | None]], groups: Sequence[Sequence[str]]) -> bool:
    return len(order) == len(groups) and all(set(g) <= set(o) for o, g in zip(order, groups))


# ---------------------------------------------------------------------------- reading the files
def has_zero_files(tag_dir: str) -> bool:
    """Whether the engine checkpoint folder holds ZeRO (or bf16) optimizer partitions."""
    return any(_OPTIM_FILE.search(f) for f in os.listdir(tag_dir))


#: the classes DeepSpeed (0.19) itself pickles into its engine files, beside tensors and plain values: the ZeRO
#: optimizer's loss scaler, ZeRO's stage enum, and the bf16 optimizer's fragment addresses (a dataclass)
ENGINE_GLOBALS = (("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
                  ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
                  ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
                  ("deepspeed.utils.tensor_fragment", "fragment_address"))


def engine_globals() -> list[Any]:
    """The classes of ``ENGINE_GLOBALS`` this DeepSpeed has (imported from it: reading its files needs it anyway)."""
    import importlib

    found = []
    for module, name in ENGINE_GLOBALS:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # another DeepSpeed version: its files cannot hold it either
            continue
    return found


def _load(path: str, weights_only: bool = True, mmap: bool = False) -> Any:
    return safe.load(path, weights_only=weights_only, allow=engine_globals() if weights_only else (), mmap=mmap)


def check_engine_files(tag_dir: str, weights_only: bool = True) -> None:
    """Read every file of the engine checkpoint in ``tag_dir`` without running code from it, before DeepSpeed reads them.

    DeepSpeed's loaders unpickle with ``weights_only=False``; a file that needs more than tensors,
    plain values and ``ENGINE_GLOBALS`` raises CheckpointError here instead. Tensors are mapped, not
    read (``mmap``), so the check costs a parse of each file's pickle.
    """
    if not weights_only:
        return
    for name in sorted(os.listdir(tag_dir)):
        path = os.path.join(tag_dir, name)
        if os.path.isfile(path) and name.endswith(".pt"):
            _load(path, mmap=zipfile.is_zipfile(path))


def _rank_files(tag_dir: str) -> list[str]:
    found = {}
    for f in os.listdir(tag_dir):
        match = _OPTIM_FILE.search(f)
        if match:
            if int(match.group(2)) != 0:
                raise CheckpointError(
                    f"{tag_dir!r} holds tensor- or pipeline-parallel shards ({f}); torchfleet reads data-parallel ZeRO "
                    "checkpoints (model-parallel rank 00 only). Load it with the DeepSpeed setup that wrote it."
                )
            found[int(match.group(1))] = os.path.join(tag_dir, f)
    if sorted(found) != list(range(len(found))) or not found:
        raise CheckpointError(
            f"{tag_dir!r} should hold one *_optim_states.pt file per rank, numbered from 0, but has ranks "
            f"{sorted(found)}. The checkpoint is incomplete (a rank failed while saving); resume from another one."
        )
    return [found[r] for r in range(len(found))]


def _model_states(tag_dir: str, weights_only: bool = True) -> Mapping[str, Any]:
    for name in _MODEL_FILES:
        path = os.path.join(tag_dir, name)
        if os.path.isfile(path):
            return _load(path, weights_only)
    raise CheckpointError(f"{tag_dir!r} lacks the engine's model-states file (one of {', '.join(_MODEL_FILES)}).")


def read_zero_optimizer(tag_dir: str, weights_only: bool = True) -> FullOptimizerState:
    """Every rank's ZeRO partitions under ``tag_dir`` mapped back onto whole parameters (one process)."""
    model = _model_states(tag_dir, weights_only)
    shapes = model.get("param_shapes")
    if isinstance(shapes, Mapping):
        shapes = [shapes]
    if not shapes:
        raise CheckpointError(f"The model-states file under {tag_dir!r} has no param_shapes: it is not a ZeRO checkpoint.")
    groups = [[(strip_wrapper(n), torch.Size(s)) for n, s in g.items()] for g in shapes]
    ranks = [_load(f, weights_only)["optimizer_state_dict"] for f in _rank_files(tag_dir)]
    if "fp32_flat_groups" in ranks[0]:
        flats = [_rank_flats(sd, sd["fp32_flat_groups"], sd["optimizer_state_dict"], tag_dir) for sd in ranks]
        per_param = _merge_stage3(flats, [p for g in groups for p in g], tag_dir)
        base = ranks[0]["optimizer_state_dict"]
    elif "single_partition_of_fp32_groups" in ranks[0]:
        flats = [_rank_flats(sd, sd["single_partition_of_fp32_groups"], sd["base_optimizer_state"], tag_dir,
                             sd.get("group_paddings")) for sd in ranks]
        paddings = ranks[0].get("param_alignment_paddings") or [[0] * len(g) for g in groups]
        per_param = {}
        for g, group in enumerate(groups):
            per_param.update(_merge_stage12([f[g] for f in flats], group, paddings[g], tag_dir))
        base = ranks[0]["base_optimizer_state"]
    else:
        raise CheckpointError(
            f"The optimizer files under {tag_dir!r} hold neither ZeRO stage 1-2 nor stage 3 partitions (keys: "
            f"{sorted(ranks[0])[:8]}). torchfleet reads checkpoints of DeepSpeed's ZeRO stages 0-3; resume with the "
            "DeepSpeed setup that wrote it."
        )
    if len(base["param_groups"]) != len(groups):
        raise CheckpointError(
            f"The checkpoint under {tag_dir!r} lists {len(groups)} groups of parameters for "
            f"{len(base['param_groups'])} optimizer param groups, so its optimizer state cannot be given back per "
            "parameter. Use its weights alone (consolidate without --with-optimizer)."
        )
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in base["param_groups"]]
    weights = {name: entry.pop(_FP32) for name, entry in per_param.items()}
    counters = {k: int(model[k]) for k in _COUNTERS if isinstance(model.get(k), int)}
    return FullOptimizerState([[n for n, _ in g] for g in groups], hyper, per_param, weights, counters)


#: the pseudo state key under which the float32 master weights travel with the optimizer states
_FP32 = "\0fp32"


@dataclass
class _Flat:
    """One flat of one rank: the float32 partition's length and its states (per-element ones cut to that length)."""

    length: int
    elementwise: dict[str, Tensor]
    scalars: dict[str, Any]


def _rank_flats(sd: Mapping[str, Any], fp32: Sequence[Tensor], base: Mapping[str, Any], tag_dir: str,
                paddings: Sequence[int] | None = None) -> list[_Flat]:
    if not isinstance(base, Mapping) or "state" not in base:
        raise CheckpointError(
            f"The optimizer state under {tag_dir!r} is not a torch optimizer state dict (an elastic ZeRO checkpoint?). "
            "Resume it with the DeepSpeed setup and world size that wrote it."
        )
    out = []
    for i, flat in enumerate(fp32):
        length = flat.numel()
        padded = length + (int(paddings[i]) if paddings else 0)
        elementwise, scalars = {_FP32: flat.reshape(-1).float()}, {}
        for key, value in base["state"].get(i, {}).items():
            if isinstance(value, Tensor) and value.dim() > 0 and value.numel() == padded:
                elementwise[key] = value.reshape(-1)[:length]
            elif isinstance(value, Tensor) and value.numel() > 1:
                raise CheckpointError(
                    f"The optimizer state {key!r} under {tag_dir!r} has {value.numel()} values for a partition of "
                    f"{padded}: it is neither one value per element nor a scalar, so it cannot be given back per "
                    "parameter. Resume with the DeepSpeed setup and world size that wrote it."
                )
            else:
                scalars[key] = value
        out.append(_Flat(length, elementwise, scalars))
    return out


def _merge_stage12(parts: Sequence[_Flat], params: Sequence[tuple[str, torch.Size]], paddings: Sequence[int],
                   tag_dir: str) -> dict[str, dict[str, Any]]:
    keys = _common_keys(parts, tag_dir)
    whole = {k: torch.cat([p.elementwise[k] for p in parts]) for k in keys}
    out, offset = {}, 0
    for (name, shape), pad in zip(params, paddings):
        n = shape.numel()
        if offset + n > whole[_FP32].numel():
            _layout_error(tag_dir, whole[_FP32].numel(), offset + n)
        out[name] = {k: v[offset:offset + n].reshape(shape).clone() for k, v in whole.items()}
        out[name].update(copy_scalars(parts[0].scalars))
        offset += n + int(pad)
    return out


def _merge_stage3(ranks: Sequence[Sequence[_Flat]], params: Sequence[tuple[str, torch.Size]],
                  tag_dir: str) -> dict[str, dict[str, Any]]:
    world = len(ranks)
    keys = _common_keys([f for r in ranks for f in r], tag_dir)
    # one stream per rank: its sub-groups' flats one after another
    streams = [{k: torch.cat([f.elementwise[k] for f in flats]) for k in keys} for flats in ranks]
    bounds = [0]
    for f in ranks[0]:
        bounds.append(bounds[-1] + f.length)
    out, offset = {}, 0
    for name, shape in params:
        n = shape.numel()
        piece = math.ceil(n / world)
        if offset + piece > bounds[-1]:
            _layout_error(tag_dir, bounds[-1] * world, (offset + piece) * world)
        out[name] = {k: torch.cat([s[k][offset:offset + piece] for s in streams])[:n].reshape(shape).clone()
                     for k in keys}
        sub_group = next(i for i in range(len(bounds) - 1) if bounds[i] <= offset < bounds[i + 1])
        out[name].update(copy_scalars(ranks[0][sub_group].scalars))
        offset += piece
    return out


def _common_keys(parts: Sequence[_Flat], tag_dir: str) -> list[str]:
    keys = list(parts[0].elementwise)
    if any(set(p.elementwise) != set(keys) for p in parts):
        raise CheckpointError(
            f"The ranks' optimizer partitions under {tag_dir!r} hold different state keys "
            f"({sorted({k for p in parts for k in p.elementwise} - {_FP32})}), so they cannot be joined. The "
            "checkpoint is inconsistent; resume from another one."
        )
    return keys


def copy_scalars(scalars: Mapping[str, Any]) -> dict[str, Any]:
    """``scalars`` with its tensors cloned (one parameter's copy of the per-flat state such as ``step``)."""
    return {k: v.clone() if isinstance(v, Tensor) else v for k, v in scalars.items()}


def _layout_error(tag_dir: str, have: int, need: int) -> None:
    raise CheckpointError(
        f"The ZeRO partitions under {tag_dir!r} hold {have} values but the saved parameter shapes need at least "
        f"{need}: the files do not match the layout of DeepSpeed 0.19 that torchfleet reads. Resume with the DeepSpeed "
        "setup and world size that wrote it."
    )
