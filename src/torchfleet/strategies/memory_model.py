"""MemoryModel: how a strategy places a model's bytes on its ranks, for ``torchfleet.estimate_memory``.

Each strategy answers ``Strategy.memory_model(module, world_size, num_nodes)`` with one of these; the planner
(torchfleet/planner) traces one training step on fake tensors as if on one device, then reads this to divide and
add per rank. No strategy type is checked anywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class MemoryModel:
    """The sharding and the extra buffers of one strategy, as the planner needs them (defaults: one device)."""

    #: how many ranks share each parameter's, gradient's and optimizer state's bytes (1: every rank holds all; not
    #: a whole number where only some parameters are split)
    param_shards: float = 1
    grad_shards: float = 1
    state_shards: float = 1
    #: what is kept in host memory instead of on the device: any of "params", "grads", "states" (with a master copy)
    offload: frozenset[str] = frozenset()
    #: a second copy of every gradient in the communication buckets (DDP without ``gradient_as_bucket_view``)
    gradient_bucket_copy: bool = False
    #: the modules gathered whole one at a time in forward and backward (FSDP's fully_shard units, the root last)
    units: tuple[nn.Module, ...] = ()
    #: whether a unit is freed after its forward (FSDP FULL_SHARD), else kept whole until backward
    reshard_after_forward: bool = True
    #: units are gathered in the precision's compute dtype (FSDP's mixed-precision policy)
    gathered_dtype_from_compute: bool = False
    #: elements of fixed communication buffers, in the gradients' dtype (DeepSpeed's reduce buckets)
    buffer_elements: int = 0
    #: this rank's gradient shard exists through the whole backward, not only as gradients arrive (DeepSpeed's
    #: contiguous gradient partition)
    gradients_held_in_backward: bool = False
    #: elements of parameters held whole in forward and backward beside their shards, in the parameters' dtype
    #: (ZeRO-3's live parameters: those under its persistence threshold and up to its max live parameters)
    gathered_elements: int = 0
    #: an fp32 copy of the parameters beside the optimizer states, sharded as they are (DeepSpeed's partitions)
    master_copy: bool = False
    #: bytes per element of the parameters and their gradients as the strategy holds them, when not as traced
    #: (DeepSpeed's fp16/bf16: 2, its fp32 master copy apart); 0: as traced
    param_itemsize: int = 0
    #: the module is trained wholly in this dtype (parameters, gradients, inputs, activations), its optimizer states
    #: and master copy in fp32 (DeepSpeed's fp16/bf16): the step is traced so
    half_dtype: torch.dtype | None = None
    #: changes the strategy makes to the module that alter the step (activation checkpointing)
    prepare: Callable[[nn.Module], None] | None = None
    #: what the planner should say about this strategy's figures (e.g. "buffers from the DeepSpeed config")
    note: str = ""
