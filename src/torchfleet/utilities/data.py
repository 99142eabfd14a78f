"""Lightning's ``utilities.data`` (both packages): questions about data loaders and batches."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, Union

import torch
from torch import Tensor
from torch.utils.data import IterableDataset

from torchfleet.errors import ConfigurationError
from torchfleet.rank_zero import rank_zero_warn
from torchfleet.utilities.parsing import AttributeDict

__all__ = ["AttributeDict", "BType", "extract_batch_size", "has_iterable_dataset", "has_len", "has_len_all_ranks",
           "sized_len", "suggested_max_num_workers"]

#: what a batch may be: tensors and strings, in mappings and iterables of them
BType = Union[Tensor, str, Mapping[Any, "BType"], Iterable["BType"]]


def sized_len(dataloader: object) -> int | None:
    """``len(dataloader)``, or None where it has no length (an iterable dataset without ``__len__``)."""
    try:
        return len(dataloader)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):
        return None


def has_len(dataloader: object) -> bool:
    """Whether ``dataloader`` has a length."""
    return sized_len(dataloader) is not None


def has_iterable_dataset(dataloader: object) -> bool:
    """Whether ``dataloader`` reads an ``IterableDataset``."""
    return isinstance(getattr(dataloader, "dataset", None), IterableDataset)


def suggested_max_num_workers(local_world_size: int) -> int:
    """The loader workers each of ``local_world_size`` processes may start: an equal share of this process's cores,
    less one for the process itself, and at least one."""
    if local_world_size < 1:
        raise ConfigurationError(f"suggested_max_num_workers(local_world_size={local_world_size!r}) is not valid: give "
                                 "the number of processes on this machine, 1 or more.")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // local_world_size - 1)


def _first_tensor(batch: Any) -> Tensor | None:
    if isinstance(batch, Tensor):
        return batch
    if isinstance(batch, str):
        return None
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, Iterable) else ()
    for value in values:
        found = _first_tensor(value)
        if found is not None:
            return found
    return None


def extract_batch_size(batch: BType) -> int:
    """The size of ``batch``: the first dimension of the first tensor in it (1 for a scalar tensor)."""
    tensor = _first_tensor(batch)
    if tensor is None:
        raise ConfigurationError(
            f"extract_batch_size found no tensor in a batch of type {type(batch).__name__}: give a batch holding a "
            "tensor (also inside dicts, lists or tuples), or pass batch_size= to self.log.")
    return tensor.size(0) if tensor.dim() else 1


def has_len_all_ranks(dataloader: object, strategy: Any,
                      allow_zero_length_dataloader_with_multiple_devices: bool = False) -> bool:
    """Whether ``dataloader`` has a length here, after the ranks summed their lengths through ``strategy.reduce``
    (a collective: every rank calls it, also one whose loader has no length, so none waits for another).

    A total of zero is warned about; an empty loader on this rank while others have batches is an error unless
    ``allow_zero_length_dataloader_with_multiple_devices``."""
    local = sized_len(dataloader)
    device = getattr(strategy, "root_device", None)
    total = int(strategy.reduce(torch.tensor(local or 0, device=device), reduce_op="sum"))
    if local is None:
        return False
    name = type(dataloader).__name__
    if total == 0:
        rank_zero_warn(f"The {name} has no batch on any rank (its total length across ranks is zero); check that "
                       "this is what you meant.")
    elif local == 0:
        if not allow_zero_length_dataloader_with_multiple_devices:
            raise ConfigurationError(
                f"This rank's {name} is empty while the ranks have {total} batches in all, so the ranks would not run "
                "the same steps. Give every rank some data, or pass "
                "allow_zero_length_dataloader_with_multiple_devices=True to go on.")
        rank_zero_warn(f"This rank's {name} is empty while the ranks have {total} batches in all.")
    return True
