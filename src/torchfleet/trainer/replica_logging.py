"""``self.log`` inside dp's replicas: each replica records its calls, the main thread logs them once, combined.

DataParallelStrategy runs a hook on one copy of the module per device, in threads. It knows nothing of
``self.log``: the Trainer gives it ``REPLICA_LOGGING`` (its ReplicaHooks), which swaps each replica's
Results for a ReplicaLog and, after the replicas finish, logs each name once into the original
module's Results with the call's ``reduce_fx`` (as if every replica's chunk were one batch: a weighted
mean when ``batch_size`` was given, else a plain mean; a sum; a max; a min).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from torchfleet.trainer.logging import normalize_reduce_fx

if TYPE_CHECKING:
    from torchfleet.module import Module


class ReplicaLogging:
    """The Trainer's ReplicaHooks: a ReplicaLog per replica while the hook runs, then one replay into Results."""

    def enter(self, replica: Module) -> ReplicaLog | None:
        """Give ``replica`` (its own copy of the module's attribute dict) a door of its own that records into a
        ReplicaLog in place of the Results (the copied door is the original module's)."""
        door = replica.loop_door
        if door.results is None:
            return None  # outside a Trainer stage: self.log records nothing
        log = ReplicaLog()
        replica.loop_door = door.with_results(log)
        return log

    def merge(self, module: Module, collected: list[Any], device: torch.device) -> None:
        """Log what the replicas recorded into the original ``module``'s Results."""
        results = module.loop_door.results
        if results is not None:
            replay_replica_logs(collected, results, device)


REPLICA_LOGGING = ReplicaLogging()

#: the parameters of ``Results.log``, in the order Module.log passes them
_LOG_PARAMS = ("fx", "name", "value", "prog_bar", "logger", "on_step", "on_epoch", "reduce_fx", "sync_dist", "batch_size")


class ReplicaLog:
    """Stands in for the Trainer's Results inside one replica: records ``self.log`` calls, logs nothing.

    ``log`` takes the arguments of ``Results.log``, which Module.log calls.
    """

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def log(self, *args: Any) -> None:
        """Record one call (the positional arguments of ``Results.log``)."""
        self.calls.append(dict(zip(_LOG_PARAMS, args)))




def _as_number_tensor(value: Any, device: torch.device) -> Tensor | None:
    """``value`` as a 0-dim float tensor on ``device``; None when it is not a single number."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            return None
        value = value.detach().reshape(())
        return (value if value.is_floating_point() else value.float()).to(device)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value), device=device)
    return None


def replay_replica_logs(logs: Sequence[ReplicaLog], results: Any, device: torch.device) -> None:
    """Log into ``results`` once per name what the replicas' ``logs`` recorded, combined with each name's reduce_fx.

    The replicas' values are treated as values of smaller batches: "mean" averages them (weighted
    by ``batch_size`` when every call gave one, which is then summed), "sum" adds them, "max" and
    "min" take the extreme. The options of the first call of a name are used. A value that is not
    a single number is handed to ``results`` as is, so it raises its usual error.
    """
    by_name: dict[str, list[dict[str, Any]]] = {}
    for log in logs:
        for call in log.calls:
            by_name.setdefault(call["name"], []).append(call)
    for calls in by_name.values():
        first = calls[0]
        values = [_as_number_tensor(c["value"], device) for c in calls]
        if any(v is None for v in values):
            bad = next(c for c, v in zip(calls, values) if v is None)
            results.log(**bad)  # Results explains what it accepts
            continue
        stacked = torch.stack(values)  # type: ignore[arg-type]
        sizes = [c["batch_size"] for c in calls]
        all_sized = all(s is not None for s in sizes)
        fx = normalize_reduce_fx(first["reduce_fx"])
        if fx == "mean":
            if all_sized and sum(sizes) > 0:
                weights = torch.tensor([float(s) for s in sizes], device=device)
                value = (stacked * weights).sum() / weights.sum()
            else:
                value = stacked.mean()
        elif fx == "sum":
            value = stacked.sum()
        elif fx == "max":
            value = stacked.max()
        else:
            value = stacked.min()
        results.log(**{**first, "value": value, "batch_size": sum(sizes) if all_sized else None})
