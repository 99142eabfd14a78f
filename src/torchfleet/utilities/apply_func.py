"""Lightning's ``utilities.apply_func``: moving nested batches to a device, and tensors to and from numbers."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["CONVERSION_DTYPES", "convert_tensors_to_scalars", "convert_to_tensors", "move_data_to_device",
           "move_to_device"]

#: the dtype ``convert_to_tensors`` gives a Python number of each type
CONVERSION_DTYPES: list[tuple[type, torch.dtype]] = [(bool, torch.uint8), (int, torch.int), (float, torch.float)]


def move_to_device(data: Any, device: torch.device) -> Any:
    """Move every tensor inside nested dicts, lists, tuples and namedtuples to ``device``."""
    if isinstance(data, Tensor):
        if data.device == device:
            return data
        return data.to(device, non_blocking=device.type == "cuda")
    if isinstance(data, dict):
        moved = {k: move_to_device(v, device) for k, v in data.items()}
        return moved if type(data) is dict else type(data)(moved)
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*[move_to_device(v, device) for v in data])
    if isinstance(data, (list, tuple)):
        on_cpu = device.type == "cpu"
        for v in data:
            # Tensor.is_cpu is much cheaper than building and comparing device objects
            if not (isinstance(v, Tensor) and (v.is_cpu if on_cpu else v.device == device)):
                return type(data)([move_to_device(v, device) for v in data])
        return data  # the common (x, y) batch already in place: no copy of the container
    return data


def move_data_to_device(batch: Any, device: torch.device | str | int) -> Any:
    """``batch`` with every tensor inside it on ``device`` (a ``torch.device``, ``"cuda:0"``, or a CUDA index)."""
    return move_to_device(batch, device if isinstance(device, torch.device) else torch.device(device))


def _map_leaves(data: Any, fn: Any) -> Any:
    if isinstance(data, dict):
        return type(data)({k: _map_leaves(v, fn) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*[_map_leaves(v, fn) for v in data])
    if isinstance(data, (list, tuple)):
        return type(data)(_map_leaves(v, fn) for v in data)
    return fn(data)


def convert_to_tensors(data: Any, device: torch.device | str | int) -> Any:
    """``data`` with its Python numbers made tensors (dtypes: ``CONVERSION_DTYPES``) and every tensor on ``device``."""
    def convert(value: Any) -> Any:
        for kind, dtype in CONVERSION_DTYPES:
            if type(value) is kind:
                return torch.tensor(value, dtype=dtype)
        return value

    return move_data_to_device(_map_leaves(data, convert), device)


def convert_tensors_to_scalars(data: Any) -> Any:
    """``data`` with every one-element tensor replaced by its Python number; a larger tensor is an error."""
    def scalar(value: Any) -> Any:
        if not isinstance(value, Tensor):
            return value
        if value.numel() != 1:
            raise ValueError(f"convert_tensors_to_scalars: a tensor of {value.numel()} elements (shape "
                             f"{tuple(value.shape)}) has no single number; give tensors of one element only.")
        return value.item()

    return _map_leaves(data, scalar)
