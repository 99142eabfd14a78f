"""Loading state dicts with errors that name the keys and shapes that do not match; what in a state is stateful."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.compiled import plain_state_dict, uncompiled
from torchfleet.errors import CheckpointError

#: what ``stateful_kind`` answers for the values a strategy saves as state dicts and loads in place
MODULE, OPTIMIZER, OPTIMIZERS = "module", "optimizer", "optimizers"


def stateful_kind(value: Any) -> str | None:
    """``MODULE``, ``OPTIMIZER``, ``OPTIMIZERS`` (a non-empty list or tuple of optimizers), or None for a plain value.

    The values of a checkpoint ``state`` that strategies turn into state dicts when saving and load
    into in place; everything else is saved and given back as it is.
    """
    if isinstance(value, nn.Module):
        return MODULE
    if isinstance(value, Optimizer):
        return OPTIMIZER
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Optimizer) for v in value):
        return OPTIMIZERS
    return None


def map_stateful(state: Mapping[str, Any], module_fn: Callable[[nn.Module], Any],
                 optimizer_fn: Callable[[Optimizer], Any]) -> dict[str, Any]:
    """``state`` with each module replaced by ``module_fn(module)`` and each optimizer (also in a list) by
    ``optimizer_fn(optimizer)``; plain values are kept as they are."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        kind = stateful_kind(value)
        if kind == MODULE:
            out[key] = module_fn(uncompiled(value))  # a torch.compile'd module saves under its own names
        elif kind == OPTIMIZER:
            out[key] = optimizer_fn(value)
        elif kind == OPTIMIZERS:
            out[key] = [optimizer_fn(v) for v in value]
        else:
            out[key] = value
    return out


def stateful_entries(checkpoint: Mapping[str, Any], state: Mapping[str, Any], path: Any = None
                     ) -> Iterator[tuple[str, Any, str, Any]]:
    """``(key, target, kind, saved entry)`` for every module or optimizer(s) in ``state``; plain values are skipped.

    Raises CheckpointError, listing the checkpoint's entries, when it has none for a target.
    """
    for key, target in state.items():
        kind = stateful_kind(target)
        if kind is None:
            continue
        if key not in checkpoint:
            raise CheckpointError(
                f"The checkpoint {path} has no entry {key!r} to load into the {type(target).__name__}. "
                f"Its entries are: {', '.join(map(repr, checkpoint))}."
            )
        saved = checkpoint[key]
        if kind == MODULE:
            # into the module inside a torch.compile wrapper; names saved from one lose their `_orig_mod.`
            target = uncompiled(target)
            saved = plain_state_dict(target, saved) if isinstance(saved, Mapping) else saved
        yield key, target, kind, saved


def paired_optimizer_states(key: str, target: Any, saved: Any, path: Any = None) -> list[tuple[Optimizer, Any]]:
    """Each optimizer of ``target`` (one, or a list) with its state in ``saved``; CheckpointError if the counts differ."""
    optimizers = [target] if isinstance(target, Optimizer) else list(target)
    states = saved if isinstance(saved, list) else [saved]
    if len(states) != len(optimizers):
        raise CheckpointError(
            f"The checkpoint {path} holds {len(states)} optimizer states under {key!r} but {len(optimizers)} "
            "optimizers were given to load them into."
        )
    return list(zip(optimizers, states))


def _listing(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def state_dict_mismatch(module: nn.Module, state: Mapping[str, Any], strict: bool = True) -> str | None:
    """Describe how ``state`` fails to fit ``module`` (missing/unexpected keys, shape changes), or None."""
    own = module.state_dict()
    problems = []
    if strict:
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if missing:
            problems.append(f"missing from the checkpoint: {_listing(missing)}")
        if unexpected:
            problems.append(f"in the checkpoint but not in the model: {_listing(unexpected)}")
    shapes = [
        f"{k!r} (checkpoint {tuple(v.shape)}, model {tuple(own[k].shape)})"
        for k, v in state.items()
        if k in own and isinstance(v, Tensor) and isinstance(own[k], Tensor) and v.shape != own[k].shape
    ]
    if shapes:
        problems.append("shape differs for " + ", ".join(shapes[:5]) + (" ..." if len(shapes) > 5 else ""))
    return "; ".join(problems) or None


def load_state_dict_checked(module: nn.Module, state: Mapping[str, Any], strict: bool = True) -> None:
    """``module.load_state_dict(state)``, raising CheckpointError that names the first mismatching keys.

    Names saved from a ``torch.compile``'d module (``_orig_mod.``) load into the plain module.
    """
    module = uncompiled(module)
    state = plain_state_dict(module, state)
    problem = state_dict_mismatch(module, state, strict=strict)
    if problem:
        raise CheckpointError(
            f"The checkpoint's weights do not fit {type(module).__name__}: {problem}. The model's "
            "architecture or its hyperparameters differ from the run that wrote the checkpoint; build the "
            "model with the same arguments, or load with strict=False to skip missing and extra keys."
        )
    module.load_state_dict(state, strict=strict)
