"""Lightning's ``utilities.memory``: telling out-of-memory errors apart, freeing cached memory, detaching outputs."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["garbage_collection_cuda", "is_cuda_out_of_memory", "is_cudnn_snafu", "is_oom_error",
           "is_out_of_cpu_memory", "recursive_detach"]


def _runtime_message(exception: BaseException) -> str:
    return str(exception.args[0]) if isinstance(exception, RuntimeError) and len(exception.args) == 1 else ""


def is_cuda_out_of_memory(exception: BaseException) -> bool:
    """Whether ``exception`` is CUDA running out of memory."""
    message = _runtime_message(exception)
    return "CUDA" in message and "out of memory" in message


def is_cudnn_snafu(exception: BaseException) -> bool:
    """Whether ``exception`` is cuDNN's way of saying it ran out of memory (a failed launch without a reason)."""
    return "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED." in _runtime_message(exception)


def is_out_of_cpu_memory(exception: BaseException) -> bool:
    """Whether ``exception`` is the CPU allocator running out of memory."""
    return "DefaultCPUAllocator: can't allocate memory" in _runtime_message(exception)


def is_oom_error(exception: BaseException) -> bool:
    """Whether ``exception`` is any of the out-of-memory errors above (``torch.OutOfMemoryError`` included)."""
    return (isinstance(exception, torch.OutOfMemoryError) or is_cuda_out_of_memory(exception)
            or is_cudnn_snafu(exception) or is_out_of_cpu_memory(exception))


def garbage_collection_cuda() -> None:
    """Collect Python's garbage, then hand CUDA's cached blocks back to the device (nothing more without CUDA)."""
    gc.collect()
    if torch.cuda.is_available():
        try:
            torch.cuda.empty_cache()
        except RuntimeError as error:
            if not is_oom_error(error):  # emptying the cache can itself run out of memory; that is fine here
                raise


def recursive_detach(in_dict: Any, to_cpu: bool = False) -> Any:
    """``in_dict`` with every tensor in it detached from the graph (and moved to the CPU with ``to_cpu``)."""
    if isinstance(in_dict, Tensor):
        out = in_dict.detach()
        return out.cpu() if to_cpu else out
    if isinstance(in_dict, Mapping):
        return type(in_dict)({k: recursive_detach(v, to_cpu) for k, v in in_dict.items()})
    if isinstance(in_dict, (list, tuple)) and not hasattr(in_dict, "_fields"):
        return type(in_dict)(recursive_detach(v, to_cpu) for v in in_dict)
    return in_dict
