"""ParallelStrategy: one process per device, joined in a torch.distributed group."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from abc import ABC
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from torchfleet import watchdog
from torchfleet.errors import ConfigurationError, TorchfleetError
from torchfleet.strategies.arguments import PARALLEL, PARTS, pick, takes
from torchfleet.strategies.groups import resolve_group
from torchfleet.strategies.processes import (
    ProcessOptions,
    Rank,
    apply_max_restarts,
    join_process_group,
    launcher_for,
)
from torchfleet.strategies.strategy import Strategy, settable
from torchfleet.strategies.utils import normalize_op
from torchfleet.watchdog import DEFAULT_HANG_TIMEOUT_S, collective

if TYPE_CHECKING:
    from torchfleet.environments.base import ClusterEnvironment

#: how long ``unbounded_barrier`` waits: about 27 years
_UNBOUNDED = timedelta(days=10_000)
#: barriers whose wait has no natural bound (rank 0 downloading in prepare_data): the hang watchdog leaves them alone
_UNBOUNDED_BARRIERS = frozenset({"prepare_data"})
#: the dtypes whose all_reduce carries a fingerprint of the collective (exact integers up to 2**24 at least), in the
#: debug mode TORCHFLEET_CHECK_COLLECTIVES=1 only: measured on 2 CPU cores, the extra element and its check made a
#: 2-process reduce ~0.2 ms slower (0.49 -> 0.72 ms), too much for every self.log(sync_dist=True) by default
_CHECKED_DTYPES = ((torch.float32, torch.float64, torch.int32, torch.int64)
                   if os.environ.get("TORCHFLEET_CHECK_COLLECTIVES") == "1" else ())


class CollectiveMismatchError(TorchfleetError, RuntimeError):
    """Ranks ran different collectives at the same point (a desync): what came back belongs to another collective."""


def _mismatch(record: collective) -> CollectiveMismatchError:
    rec = watchdog.current()
    where = f" ({rec['where']})" if rec["where"] else ""
    return CollectiveMismatchError(
        f"Desync: this rank's collective #{record.seq} {rec['name']} (called at {rec['site']}{where}) was matched "
        "by a different collective on another rank, so the ranks no longer issue the same collectives in the same "
        f"order. {watchdog._DESYNC_HINT}"
    )


def _option(name: str, doc: str) -> property:
    """A property for the process option ``name``: read from ``processes``; set anew (checked), the launcher told."""

    def set_option(self: ParallelStrategy, value: Any) -> None:
        self.processes = dataclasses.replace(self.processes, **{name: value})
        apply_max_restarts(self._launcher, self.processes, self.cluster_environment, self.num_processes, self.num_nodes)

    return property(lambda self: getattr(self.processes, name), set_option, doc=doc)


class ParallelStrategy(Strategy, ABC):
    """A strategy with one process per device, on one or more nodes, joined in a torch.distributed group.

    Holds the ClusterEnvironment (who started the processes, where rank 0 listens), the process options
    (``processes``: processes.ProcessOptions) and the launcher they choose (``configure``); each rank joins the
    process group in ``setup_environment`` (processes.join_process_group). Collectives go through
    ``torch.distributed``; subclasses decide how the module is wrapped (DDP, fully_shard, DeepSpeed). A subclass
    that takes ``timeout``, ``start_method`` or ``max_restarts`` sets ``self.processes = ProcessOptions.of(given)``.
    """

    @takes(*PARALLEL)
    def __init__(self, given: dict[str, Any]) -> None:
        super().__init__(**pick(given, PARTS))
        #: this node's devices, one per process (Lightning's ``parallel_devices``; set by ``configure`` when not given)
        self.parallel_devices = given["parallel_devices"]
        self._cluster_environment = given["cluster_environment"]
        self._num_nodes = 1
        #: how the ranks start and join (a subclass taking timeout, start_method, max_restarts replaces it)
        self.processes = ProcessOptions.of(given)
        #: seconds a rank may wait in one collective before the watchdog stops the run with a report (None: off)
        self.hang_timeout: float | None = DEFAULT_HANG_TIMEOUT_S
        #: sync_batchnorm converted the Module's BatchNorm layers in this stage: teardown converts them back
        self._layers_synced = False

    cluster_environment = settable("_cluster_environment", "Who started the processes and where rank 0 listens.")

    @property
    def requested_device_type(self) -> str | None:
        return self.parallel_devices[0].type if self.parallel_devices else None

    def configure(self, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment) -> None:
        if self.parallel_devices is None:
            self.parallel_devices = devices
        if any(torch.device(d).type == "mps" for d in self.parallel_devices):
            # torch.distributed has no backend for MPS tensors: init_process_group would succeed, the first
            # collective would not; say so here, before any process starts
            raise ConfigurationError(
                f"{type(self).__name__} runs its processes in a torch.distributed group, which has no backend for "
                "MPS devices: strategies from the DDP family are not supported on the MPS accelerator (here: "
                f"devices {[str(d) for d in self.parallel_devices]}). Use strategy='auto' (or 'single_device') to "
                "train on the Mac's GPU in one process, or accelerator='cpu' to run several processes on the CPU."
            )
        self._num_nodes = num_nodes
        if self._cluster_environment is None:
            self._cluster_environment = cluster_environment
        # the pre-flight check (a launch that disagrees with devices x num_nodes) runs where Lightning runs it: in
        # launcher.launch, before any process starts or waits in init_process_group for ranks that never come
        self.set_world_ranks()
        self._launcher = launcher_for(self.processes, self._cluster_environment, self.num_processes, num_nodes)

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices else 1

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """``num_replicas`` (the world size) and ``rank`` (this process's global rank) for a DistributedSampler."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}

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
        if self.processes.process_group_backend is not None:
            return self.processes.process_group_backend
        import torch.distributed as dist

        return dist.Backend.default_device_backend_map.get(self.root_device.type, "gloo")

    timeout = _option("timeout", "How long a collective may wait (a timedelta; None: torch's default).")
    start_method = _option("start_method", 'How the launcher starts the ranks: "popen", "spawn", "fork" or "forkserver".')
    max_restarts = _option("max_restarts", "How many times every rank is started again after one fails (resuming "
                                           "from the newest checkpoint).")

    @property
    def is_distributed(self) -> bool:
        """Always True (Lightning's, deprecated there): this strategy runs a process group."""
        return True

    # ----------------------------------------------------------------- processes
    def set_world_ranks(self) -> None:
        """Tell the cluster environment this process's global rank and the world size (from devices x nodes).

        Environments that decide the ranks themselves (torchrun, SLURM, ...) ignore it.
        """
        env = self.cluster_environment
        assert env is not None
        env.set_world_size(self.num_processes * self.num_nodes)
        env.set_global_rank(self.node_rank * self.num_processes + self.local_rank)

    def setup_environment(self) -> None:
        """Select this process's device, then ``setup_distributed`` (ranks and the process group)."""
        env = self.cluster_environment
        if env is not None and env.creates_processes_externally:
            # torchrun/srun started this rank: Fleet may get here without launch(), whose pre-flight check it is
            env.validate_settings(len(self.parallel_devices or ()), self.num_nodes)
        super().setup_environment()
        self.setup_distributed()

    def setup_distributed(self) -> None:
        """Record this process's ranks (``set_world_ranks``) and join the process group, once per process."""
        self.set_world_ranks()
        env = self.cluster_environment
        assert env is not None
        join_process_group(Rank(env, self.world_size, self.global_rank, self.num_nodes, self.root_device,
                                self.process_group_backend, self.timeout, self.hang_timeout))

    @property
    def distributed_ready(self) -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def sync_batchnorm(self, module: Any) -> Any:
        """``module`` with its BatchNorm layers synchronised across the ranks when the caller asked for
        ``sync_batchnorm``, else as it is; the Module's layers are reverted at teardown."""
        if not self.training_settings.sync_batchnorm:
            return module
        from torchfleet.strategies.sync_batchnorm import convert_sync_batchnorm

        converted = convert_sync_batchnorm(module, self.root_device)
        self._layers_synced = self._layers_synced or module is self.lightning_module
        return converted

    # A one-process world skips the collective calls entirely: identities, as on SingleDeviceStrategy.
    # Every collective is recorded (watchdog.collective: a number, a name, the user's call site) for the hang and
    # desync report. A fingerprint of that record travels in all_gather's shape exchange and in the pickled
    # payload of broadcast/all_gather_object (free there), and in CPU all_reduces in the debug mode
    # TORCHFLEET_CHECK_COLLECTIVES=1: ranks that paired different collectives notice it at once.
    def reduce(self, tensor: Tensor | Any, group: Any | None = None, reduce_op: Any = "mean") -> Tensor | Any:
        """Reduce ``tensor`` over ``group`` (None: every rank; a ProcessGroup, a 1-D DeviceMesh or the name of a
        dimension of ``module_device_mesh``); a number becomes a tensor on ``root_device``."""
        op = normalize_op(reduce_op)
        if self.world_size == 1 or not self.distributed_ready:
            return tensor
        import torch.distributed as dist

        over = ""
        if group is not None:
            group, over = resolve_group(self, group, "all_reduce")

        if not isinstance(tensor, Tensor):
            tensor = torch.tensor(float(tensor), device=self.root_device)
        out = tensor.detach().clone()
        if not out.is_floating_point() and op == "mean":
            out = out.float()
        size = self.world_size if group is None else dist.get_world_size(group)
        dist_op = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        with collective("all_reduce", group=over) as record:
            if out.device.type == "cpu" and out.dtype in _CHECKED_DTYPES and group is None:
                fingerprint = record.fingerprint()
                packed = torch.cat([out.reshape(-1), out.new_tensor([fingerprint])])
                dist.all_reduce(packed, op=dist_op)
                expected = fingerprint * self.world_size if op in ("mean", "sum") else fingerprint
                if packed[-1].item() != expected:
                    raise _mismatch(record)
                out = packed[:-1].view_as(out)
            else:
                dist.all_reduce(out, op=dist_op, group=group)
        if op == "mean":
            out = out / size
        return out

    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor | list[Tensor]:
        """Stack ``tensor`` from every rank along a new first dimension.

        When the ranks' tensors differ in their first dimension (per-sample outputs of uneven
        shards), the result is instead a list with each rank's tensor, in rank order. A ``group`` other than
        every rank (as ``reduce``'s) gathers through torch directly (same shapes on its ranks).
        """
        if self.world_size == 1 or not self.distributed_ready:
            return tensor.unsqueeze(0)
        if group is not None:
            group, over = resolve_group(self, group, "all_gather")
        if group is not None:
            import torch.distributed as dist

            with collective("all_gather", group=over):
                if sync_grads:
                    from torch.distributed.nn.functional import all_gather as differentiable_all_gather

                    return torch.stack(differentiable_all_gather(tensor.contiguous(), group=group))
                out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
                dist.all_gather(out, tensor.contiguous(), group=group)
                return torch.stack(out)
        with collective("all_gather") as record:
            return self._all_gather(tensor, sync_grads, record)

    def _all_gather(self, tensor: Tensor, sync_grads: bool, record: collective) -> Tensor | list[Tensor]:
        import torch.distributed as dist

        tensor = tensor.contiguous()
        # one small collective to learn the shapes (and check the ranks are in the same collective); the data
        # moves padded to the longest
        shape = torch.tensor([tensor.dim(), *tensor.shape, *([0] * (8 - tensor.dim())), record.fingerprint()],
                             device=tensor.device)
        shapes = [torch.empty_like(shape) for _ in range(self.world_size)]
        dist.all_gather(shapes, shape)
        if any(int(s[-1]) != int(shape[-1]) for s in shapes):
            raise _mismatch(record)
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

        with collective("broadcast") as record:
            box = [(record.fingerprint(), obj)]
            dist.broadcast_object_list(box, src=src)
            fingerprint, value = box[0]
            if fingerprint != record.fingerprint():
                raise _mismatch(record)
        return value

    def all_gather_object(self, obj: Any, name: str | None = None) -> list[Any]:
        if self.world_size == 1 or not self.distributed_ready:
            return [obj]
        import torch.distributed as dist

        with collective(f"all_gather_object({name})" if name else "all_gather_object") as record:
            out: list[Any] = [None] * self.world_size
            dist.all_gather_object(out, (record.fingerprint(), obj))
            if any(not isinstance(o, tuple) or o[0] != record.fingerprint() for o in out):
                raise _mismatch(record)
        return [o[1] for o in out]

    def barrier(self, name: str | None = None) -> None:
        if self.world_size == 1 or not self.distributed_ready:
            return
        import torch.distributed as dist

        with collective(f"barrier({name})" if name else "barrier", bounded=name not in _UNBOUNDED_BARRIERS):
            dist.barrier()

    def run_backward(self, tensor: Tensor, module: Any, *args: Any, **kwargs: Any) -> None:
        # the gradient all-reduce (DDP) or reduce-scatter (FSDP) runs inside backward: recorded as one collective
        if self.world_size == 1 or not self.distributed_ready:
            return super().run_backward(tensor, module, *args, **kwargs)
        with collective("backward (gradient synchronisation)"):
            super().run_backward(tensor, module, *args, **kwargs)
        return None

    @contextlib.contextmanager
    def unbounded_barrier(self) -> Iterator[Callable[[], None]]:
        """A barrier on a gloo group of its own whose timeout is practically unbounded (created by every process at
        the start of the block, so the waiting processes wait in the barrier, not in the group's rendezvous)."""
        if self.world_size == 1 or not self.distributed_ready:
            yield lambda: None
            return
        import torch.distributed as dist

        group = dist.new_group(backend="gloo", timeout=_UNBOUNDED)

        def wait() -> None:
            with collective("barrier(rank zero first)", bounded=False):
                dist.barrier(group=group)

        try:
            yield wait
        finally:
            dist.destroy_process_group(group)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        if self.world_size == 1 or not self.distributed_ready:
            return bool(decision)
        import torch.distributed as dist

        with watchdog.labelled("reduce_boolean_decision"):
            votes = self.reduce(torch.tensor(int(decision), device=self.root_device), reduce_op=dist.ReduceOp.SUM)
        return bool(votes == self.world_size) if all else bool(votes > 0)

    def teardown(self) -> None:
        """SyncBatchNorm layers are reverted, the cluster environment undoes what it changed, then Strategy's teardown.

        The process group stays: it is joined once per process (a later Trainer or Fleet in the script reuses it)
        and destroyed when the process exits. What a run created on top of it is its own to give back (the
        collectives' groups of ``unbounded_barrier`` and the preemption agreement end with their use).
        """
        module = self.lightning_module
        if self._layers_synced and module is not None:
            from torchfleet.strategies.sync_batchnorm import revert_sync_batchnorm

            revert_sync_batchnorm(module)
            self._layers_synced = False
        if self.cluster_environment is not None:
            self.cluster_environment.teardown()
        super().teardown()
