"""Which DeepSpeed accelerator a DeepSpeedStrategy run uses (the one for torchfleet's device, chosen before DeepSpeed's),
and the process environment ``deepspeed.initialize`` reads.

Importing this module does not import deepspeed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from torchfleet.errors import ConfigurationError

#: our device type -> (module, class) of DeepSpeed's accelerator for it
_DS_ACCELERATORS = {
    "cpu": ("deepspeed.accelerator.cpu_accelerator", "CPU_Accelerator"),
    "cuda": ("deepspeed.accelerator.cuda_accelerator", "CUDA_Accelerator"),
    "mps": ("deepspeed.accelerator.mps_accelerator", "MPS_Accelerator"),
}


def deepspeed_accelerator_name(device: torch.device) -> str:
    """The name of DeepSpeed's accelerator that trains on ``device`` (its ``device_name()``)."""
    if device.type not in _DS_ACCELERATORS:
        raise ConfigurationError(
            f"DeepSpeedStrategy cannot train on {device.type!r} devices: torchfleet runs DeepSpeed on "
            f"{', '.join(sorted(_DS_ACCELERATORS))}. Choose one of those with Trainer(accelerator=...)."
        )
    return device.type


def select_deepspeed_accelerator(device: torch.device) -> Any:
    """Make DeepSpeed's accelerator the one for ``device`` before DeepSpeed places anything; returns it.

    DeepSpeed picks its accelerator by itself (DS_ACCELERATOR, else whatever hardware it finds), so
    on a machine with a GPU it would put an ``accelerator="cpu"`` run's engine on cuda:0, or call
    ``set_device`` with an ordinal the CPU ranks do not have. Ours is the user's choice: it wins.
    """
    import importlib

    from deepspeed.accelerator import real_accelerator

    name = deepspeed_accelerator_name(device)
    current = real_accelerator.ds_accelerator
    if current is None or current.device_name() != name:
        module, cls = _DS_ACCELERATORS[name]
        real_accelerator.set_accelerator(getattr(importlib.import_module(module), cls)())
    return real_accelerator.get_accelerator()


def device_rank(device: torch.device, local_rank: int) -> int:
    """The ``device_rank`` handed to ``deepspeed.initialize``: the CUDA index, else the local rank."""
    # DeepSpeed calls set_device(device_rank); on the CPU that is a no-op, but a negative value would make the
    # engine believe it runs alone (world size 1), so the CPU gets the local rank as a harmless index
    if device.type == "cuda":
        return device.index if device.index is not None else local_rank
    return local_rank


def skip_shm_build(device: torch.device) -> None:
    """Keep DeepSpeed from compiling its shared-memory communication op (~1-2 minutes) when it joins our process group.

    DeepSpeed builds that op whenever it attaches to a process group on CPU, but uses it only in
    ``inference_all_reduce`` (tensor-parallel inference), never in training; marking it incompatible
    makes DeepSpeed fall back to the torch.distributed collectives it uses for training anyway.
    """
    if device.type != "cpu":
        return
    import deepspeed.comm as ds_comm
    import deepspeed.ops

    if getattr(ds_comm.comm, "cdb", None) is not None:
        return  # already attached in this process
    compatible = deepspeed.ops.__compatible_ops__
    compatible["deepspeed_shm_comm"] = False


@contextlib.contextmanager
def local_rank_env(local_rank: int) -> Iterator[None]:
    # deepspeed.initialize reads LOCAL_RANK from the environment; torchfleet's launchers do not always set it in
    # rank 0, and a LOCAL_RANK left behind would make a later Trainer think it runs under torchrun
    before = os.environ.get("LOCAL_RANK")
    os.environ["LOCAL_RANK"] = str(local_rank)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LOCAL_RANK", None)
        else:
            os.environ["LOCAL_RANK"] = before
