"""Lightning's ``utilities.data`` (both packages): questions about data loaders and batches."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, Union

from torch import Tensor
from torch.utils.data import IterableDataset

from torchfleet.errors import ConfigurationError
from torchfleet.utilities.parsing import AttributeDict

__all__ = ["AttributeDict", "BType", "extract_batch_size", "has_iterable_dataset", "has_len", "sized_len",
           "suggested_max_num_workers"]

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
