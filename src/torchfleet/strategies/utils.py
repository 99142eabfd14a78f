"""What every strategy uses on nested batches and outputs: device moves, tensor maps, reduce ops, creation context."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from torchfleet.errors import ConfigurationError
from torchfleet.utilities.apply_func import move_to_device  # noqa: F401  (strategies and clients import it from here)

ReduceOp = str  # "mean" | "sum" | "max" | "min"
REDUCE_OPS = ("mean", "sum", "max", "min")


def apply_to_tensors(data: Any, fn: Callable[[Tensor], Any]) -> Any:
    """``fn`` applied to every tensor (and number, as a tensor) inside nested dicts, lists and tuples."""
    if isinstance(data, Tensor):
        return fn(data)
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return fn(torch.tensor(data))
    if isinstance(data, dict):
        return {k: apply_to_tensors(v, fn) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(apply_to_tensors(v, fn) for v in data)
    return data


#: what Lightning's ``reduce(..., reduce_op=)`` also accepts: its spelling of the mean, and torch's ReduceOp members
_OP_NAMES = {"avg": "mean", "average": "mean", "mean": "mean", "sum": "sum", "max": "max", "min": "min"}


def normalize_op(op: Any) -> ReduceOp:
    """``op`` as one of REDUCE_OPS: a name (any case, "avg" for the mean) or a ``torch.distributed.ReduceOp``."""
    name = op if isinstance(op, str) else getattr(op, "name", None) or str(op).rpartition(".")[2]
    found = _OP_NAMES.get(str(name).lower())
    if found is None:
        raise ConfigurationError(
            f"Unknown reduce operation {op!r}. Accepted operations are: {', '.join(map(repr, REDUCE_OPS))} (also "
            "'avg', and torch.distributed.ReduceOp.SUM/AVG/MAX/MIN)."
        )
    return found


def _check_op(op: Any) -> None:
    normalize_op(op)


def creation_context(device: torch.device | str, dtype: torch.dtype) -> contextlib.ExitStack:
    """A context in which new tensors are created on ``device`` with default dtype ``dtype``."""
    from torchfleet.precision import _DefaultDtype

    stack = contextlib.ExitStack()
    stack.enter_context(torch.device(device))
    stack.enter_context(_DefaultDtype(dtype))
    return stack


def check_keep_sharded(owner: str, value: Any) -> bool:
    """``keep_sharded`` of a sharded strategy, checked: True or False."""
    if not isinstance(value, bool):
        raise ConfigurationError(
            f"{owner}(keep_sharded={value!r}) is not valid: give False (the default: when a stage ends the module is "
            "made whole again on every rank, so user code can call it on any rank) or True (it stays sharded, for a "
            "model too large for one process; then call it on every rank together)."
        )
    return value


def stays_sharded(keep_sharded: bool, start_method: str, interrupted: bool) -> bool:
    """Whether the end of a stage leaves a sharded strategy's module as it is instead of making it whole.

    So after a stage that raised (the other ranks may be anywhere; gathering needs all of them), and with
    ``keep_sharded`` while the ranks outlive the stage: spawned or forked ranks end with it, and the caller's
    process then takes rank 0's whole weights.
    """
    return interrupted or (keep_sharded and start_method == "popen")
