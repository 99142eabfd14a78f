"""ModelParallelStrategy's MemoryModel: what one rank of a (data parallel x tensor parallel) mesh holds.

The Module's ``configure_model`` decides the plan (which layers are column- or row-wise parallel, what is sharded
over the data-parallel dimension). The planner reads it by running ``configure_model`` once on a meta-device copy
of the module, with a DeviceMesh of the run's shape over torch's in-process "fake" process group (no process starts,
no collective runs, nothing is allocated). Each parameter's placement on the "tensor_parallel" dimension then says
how it is split; the fake model the planner traces is narrowed to one tensor-parallel rank's shards, so the traced
step computes what that rank computes: its parameters, gradients, optimizer states and its activations (a
column-wise layer's output is narrowed, a row-wise layer's input). The "data_parallel" dimension shards what remains,
FSDP's way, over the modules ``configure_model`` passed to ``fully_shard``.

If ``configure_model`` cannot run there (a process group already exists, or the hook needs more than the mesh), the
plan falls back to the sizes: every ``nn.Linear`` parameter divided by the tensor-parallel size, the rest whole.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from torchfleet.strategies.memory_model import MemoryModel

log = logging.getLogger(__name__)

MESH_DIMS = ("data_parallel", "tensor_parallel")


class _Holder:
    """What a Module's ``device_mesh`` reads during the planning run (``trainer.strategy.module_device_mesh``)."""

    def __init__(self, mesh: Any) -> None:
        self.strategy = self
        self.module_device_mesh = mesh


@contextlib.contextmanager
def _fake_world(world_size: int) -> Iterator[None]:
    """torch's in-process fake process group of ``world_size`` ranks (this is rank 0), removed afterwards."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` on the meta device (its Trainer or Fleet not copied)."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for key in ("_trainer", "_fleet"):
            owner = sub.__dict__.get(key)
            if owner is not None:
                memo[id(owner)] = None
    for tensor in [*module.parameters(), *module.buffers()]:
        meta = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
        memo[id(tensor)] = nn.Parameter(meta, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else meta
    return copy.deepcopy(module, memo)


def traced_plan(module: nn.Module, dp: int, tp: int) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Run ``module.configure_model()`` on a meta copy over a fake ``(dp, tp)`` mesh; returns each parameter's shape
    on one tensor-parallel rank (data-parallel sharding left out) and the names of the ``fully_shard`` units."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard

    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("a process group exists already")
    with unset_fake_temporarily():
        meta = _meta_copy(module)
        with _fake_world(dp * tp):
            mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=MESH_DIMS)
            object.__setattr__(meta, "_trainer", _Holder(mesh))
            object.__setattr__(meta, "_fleet", None)
            meta.configure_model()
            shapes = {}
            for name, param in meta.named_parameters():
                shape = list(param.shape)
                if isinstance(param, DTensor) and "tensor_parallel" in (param.device_mesh.mesh_dim_names or ()):
                    placement = param.placements[param.device_mesh.mesh_dim_names.index("tensor_parallel")]
                    if isinstance(placement, Shard):
                        shape[placement.dim] = -(-shape[placement.dim] // tp)
                shapes[name] = tuple(shape)
            units = [name for name, sub in meta.named_modules() if isinstance(sub, FSDPModule)]
    return shapes, units


def _narrow(model: nn.Module, shapes: dict[str, tuple[int, ...]]) -> None:
    """Replace ``model``'s (fake) parameters by fresh ones of one tensor-parallel rank's shapes."""
    for name, param in list(model.named_parameters()):
        shape = shapes.get(name)
        if shape is not None and tuple(param.shape) != shape:
            owner, _, leaf = name.rpartition(".")
            sub = model.get_submodule(owner) if owner else model
            sub._parameters[leaf] = nn.Parameter(torch.empty(shape, dtype=param.dtype, device=param.device),
                                                 param.requires_grad)


def tensor_parallel_model(module: nn.Module, dp: int, tp: int) -> MemoryModel:
    """The MemoryModel of a ``(dp, tp)`` mesh for ``module`` (the planner's fake copy, ``configure_model`` not run)."""
    try:
        shapes, unit_names = traced_plan(module, dp, tp)
    except Exception as exc:  # the hook needs more than a mesh: plan from the sizes
        log.debug("configure_model could not be traced for the memory plan: %s", exc)
        total = sum(p.numel() for p in module.parameters())
        linear = sum(p.numel() for m in module.modules() if isinstance(m, nn.Linear) for p in m.parameters(False))
        share = (total - linear) + linear / tp
        shards = dp * total / share if share else dp
        return MemoryModel(param_shards=shards, grad_shards=shards, state_shards=shards, note=(
            f"configure_model could not run on the planner's fake mesh ({exc}); planned as every nn.Linear split "
            f"over tensor_parallel_size={tp}, activations whole"))
    modules = dict(module.named_modules())
    units = tuple(modules[name] for name in unit_names if name in modules and name)
    if unit_names:
        units = (*units, module)
    sharded = bool(unit_names) and dp > 1
    return MemoryModel(param_shards=dp if sharded else 1, grad_shards=dp if sharded else 1,
                       state_shards=dp if sharded else 1, units=units if sharded else (),
                       prepare=lambda model: _narrow(model, shapes),
                       note=f"configure_model's tensor-parallel plan traced on a fake {dp} x {tp} mesh")
