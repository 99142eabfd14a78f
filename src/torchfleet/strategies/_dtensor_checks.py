"""DTensor checks for ModelParallelStrategy: even tensor-parallel shards, and a gradient norm over several meshes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from torchfleet.errors import ConfigurationError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

#: the mesh's dimension names, outermost first (Lightning's)
MESH_DIMS = ("data_parallel", "tensor_parallel")


def has_dtensors(module: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def check_even_shards(module: nn.Module, mesh: DeviceMesh) -> None:
    """Refuse a parameter whose tensor-parallel dimension does not divide by the tensor-parallel size.

    DTensor splits it unevenly without a word, and the next layer, expecting equal local shards, then computes
    with the wrong shapes or fails far from the cause.
    """
    from torch.distributed.tensor import DTensor, Shard

    names = mesh.mesh_dim_names or ()
    if MESH_DIMS[1] not in names:
        return
    tp_dim = names.index(MESH_DIMS[1])
    tp = mesh.size(tp_dim)
    for name, param in module.named_parameters():
        if not isinstance(param, DTensor) or param.device_mesh.mesh_dim_names is None:
            continue
        param_names = param.device_mesh.mesh_dim_names
        if MESH_DIMS[1] not in param_names:
            continue
        placement = param.placements[param_names.index(MESH_DIMS[1])]
        if isinstance(placement, Shard) and param.shape[placement.dim] % tp:
            raise ConfigurationError(
                f"{name} has size {param.shape[placement.dim]} in dimension {placement.dim}, which tensor "
                f"parallelism splits over tensor_parallel_size={tp} ranks, but {param.shape[placement.dim]} does not "
                f"divide by {tp}. Make the model's dimensions (hidden size, heads, vocabulary) multiples of "
                f"{tp}, or choose a tensor_parallel_size that divides them."
            )


def total_norm(grads: list[Tensor], norm_type: float = 2.0) -> Tensor:
    """The ``norm_type`` norm of all ``grads`` together, as a plain tensor, whatever meshes their DTensors are on."""
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list[Tensor]] = {}
    for g in grads:
        key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else g.device
        groups.setdefault(key, []).append(g)
    norms = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm(group, norm_type)
        norms.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float().cpu())
    if not norms:
        return torch.tensor(0.0)
    stacked = torch.stack(norms)
    if math.isinf(norm_type):
        return stacked.max()
    return stacked.pow(norm_type).sum().pow(1.0 / norm_type)
