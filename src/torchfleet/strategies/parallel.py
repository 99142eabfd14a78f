"""ParallelStrategy: one process per device, joined in a torch.distributed group."""

from __future__ import annotations

import contextlib
from abc import ABC
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from torchfleet.errors import ConfigurationError
from torchfleet.strategies.strategy import Strategy
from torchfleet.strategies.utils import ReduceOp, _check_op

if TYPE_CHECKING:
    from torchfleet.accelerators.base import Accelerator
    from torchfleet.checkpoint.io import CheckpointIO
    from torchfleet.environments.base import ClusterEnvironment
    from torchfleet.precision import Precision

#: how long ``unbounded_barrier`` waits: about 27 years
_UNBOUNDED = timedelta(days=10_000)


class ParallelStrategy(Strategy, ABC):
    """A strategy with one process per device, on one or more nodes, joined in a torch.distributed group.

    Holds the ClusterEnvironment (who started the processes, where rank 0 listens) and the
    launcher. Collectives go through ``torch.distributed``; subclasses decide how the module is
    wrapped (DDP, fully_shard, DeepSpeed).
    """

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        process_group_backend: str | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        super().__init__(accelerator=accelerator, precision=precision, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        self.parallel_devices = parallel_devices
        self._cluster_environment = cluster_environment
        self._num_nodes = 1
        self._process_group_backend = process_group_backend

    @property
    def cluster_environment(self) -> ClusterEnvironment | None:
        return self._cluster_environment

    @cluster_environment.setter
    def cluster_environment(self, env: ClusterEnvironment | None) -> None:
        self._cluster_environment = env

    @property
    def requested_device_type(self) -> str | None:
        return self.parallel_devices[0].type if self.parallel_devices else None

    def configure(self, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment) -> None:
        if self.parallel_devices is None:
            self.parallel_devices = devices
        self._num_nodes = num_nodes
        if self._cluster_environment is None:
            self._cluster_environment = cluster_environment

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices else 1

    @property
    def world_size(self) -> int:
        env = self.cluster_environment
        return env.world_size() if env is not None else self.num_processes * self.num_nodes

    @property
    def global_rank(self) -> int:
        env = self.cluster_environment
        return env.global_rank() if env is not None else 0

    @property
    def local_rank(self) -> int:
        env = self.cluster_environment
        return env.local_rank() if env is not None else 0

    @property
    def node_rank(self) -> int:
        env = self.cluster_environment
        return env.node_rank() if env is not None else 0

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None, "configure() runs before root_device is read"
        return self.parallel_devices[self.local_rank]

    @property
    def device_ids(self) -> list[int]:
        devices = self.parallel_devices or []
        return [d.index if d.index is not None else i for i, d in enumerate(devices)]

    @property
    def process_group_backend(self) -> str:
        """The torch.distributed backend: the one given, else the default for the root device's type."""
        if self._process_group_backend is not None:
            return self._process_group_backend
        import torch.distributed as dist

        return dist.Backend.default_device_backend_map.get(self.root_device.type, "gloo")

    @property
    def distributed_ready(self) -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    # A one-process world skips the collective calls entirely: identities, as on SingleDeviceStrategy.
    def reduce(self, tensor: Tensor | float, op: ReduceOp = "mean") -> Tensor | float:
        _check_op(op)
        if self.world_size == 1 or not self.distributed_ready:
            return tensor
        import torch.distributed as dist

        if not isinstance(tensor, Tensor):
            tensor = torch.tensor(float(tensor), device=self.root_device)
        out = tensor.detach().clone()
        if not out.is_floating_point() and op == "mean":
            out = out.float()
        dist_op = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        dist.all_reduce(out, op=dist_op)
        if op == "mean":
            out = out / self.world_size
        return out

    def all_gather(self, tensor: Tensor, sync_grads: bool = False) -> Tensor | list[Tensor]:
        """Stack ``tensor`` from every rank along a new first dimension.

        When the ranks' tensors differ in their first dimension (per-sample outputs of uneven
        shards), the result is instead a list with each rank's tensor, in rank order.
        """
        if self.world_size == 1 or not self.distributed_ready:
            return tensor.unsqueeze(0)
        import torch.distributed as dist

        tensor = tensor.contiguous()
        # one small collective to learn the shapes; the data moves padded to the longest
        shape = torch.tensor([tensor.dim(), *tensor.shape, *([0] * (8 - tensor.dim()))], device=tensor.device)
        shapes = [torch.empty_like(shape) for _ in range(self.world_size)]
        dist.all_gather(shapes, shape)
        firsts = [int(s[1]) if int(s[0]) > 0 else None for s in shapes]
        if any(int(s[0]) != tensor.dim() or not torch.equal(s[2:], shape[2:]) for s in shapes):
            raise ConfigurationError(
                f"all_gather got tensors that differ in more than their first dimension across ranks (this rank: "
                f"{tuple(tensor.shape)}). Only the first dimension may differ; pad or reshape the others first."
            )
        uneven = len(set(firsts)) > 1
        if sync_grads:
            if uneven:
                raise ConfigurationError(
                    "all_gather(sync_grads=True) needs the same shape on every rank, but the first dimensions differ "
                    f"({firsts}). Pad to a common length first, or gather without gradients."
                )
            from torch.distributed.nn.functional import all_gather as differentiable_all_gather

            return torch.stack(differentiable_all_gather(tensor))
        if not uneven:
            out = [torch.empty_like(tensor) for _ in range(self.world_size)]
            dist.all_gather(out, tensor)
            return torch.stack(out)
        longest = max(f for f in firsts if f is not None)
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        out = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(out, padded)
        return [o[:n] for o, n in zip(out, firsts)]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self.world_size == 1 or not self.distributed_ready:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        if self.world_size == 1 or not self.distributed_ready:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self, name: str | None = None) -> None:
        if self.world_size == 1 or not self.distributed_ready:
            return
        import torch.distributed as dist

        dist.barrier()

    @contextlib.contextmanager
    def unbounded_barrier(self) -> Iterator[Callable[[], None]]:
        """A barrier on a gloo group of its own whose timeout is practically unbounded (created by every process at
        the start of the block, so the waiting processes wait in the barrier, not in the group's rendezvous)."""
        if self.world_size == 1 or not self.distributed_ready:
            yield lambda: None
            return
        import torch.distributed as dist

        group = dist.new_group(backend="gloo", timeout=_UNBOUNDED)
        try:
            yield lambda: dist.barrier(group=group)
        finally:
            dist.destroy_process_group(group)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        if self.world_size == 1 or not self.distributed_ready:
            return bool(decision)
        votes = self.reduce(torch.tensor(int(decision), device=self.root_device), op="sum")
        return bool(votes == self.world_size) if all else bool(votes > 0)
