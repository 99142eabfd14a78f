"""XLAStrategy: train on XLA devices (TPUs; XLA's CPU backend) through torch_xla, in one of two forms.

``mode="launch"`` (the default, Lightning's ``strategy="xla"``): one replica per device, started by torch_xla's
launcher (``launchers/xla.py``); each replica computes its shard of the data (a DistributedSampler) and the
gradients are averaged across replicas after backward (``xm.all_reduce``), so gradient clipping sees the
averaged gradients as under ddp. Collectives (``self.log(sync_dist=True)``, all_gather, broadcast, barrier) run
as XLA all-reduces. Replicas that share a process (XLA's CPU backend) take each step's program from one
compilation and wait for their device before the step ends (the workaround for the hang, see launchers/xla.py).

``mode="spmd"``: one process, one program over a 1-D device mesh ("data") of every device: the parameters are
replicated and each batch is sharded along its first dimension (``xs.mark_sharding``); XLA's partitioner inserts
the gradient reductions. To the Trainer it is one process (world size 1): the logged loss is already the mean
over the whole batch.

Checkpoints are written on the host in torchfleet's one-file format (every tensor moved to the CPU), so they load
under ddp, single_device or the other mode, and those load here. torch_xla is imported only when the strategy
sets up; without it the constructor raises one paragraph with the install command.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.accelerators.xla import xla_installed, xla_not_installed
from torchfleet.errors import ConfigurationError, check_flag
from torchfleet.strategies.arguments import takes
from torchfleet.strategies.strategy import Strategy
from torchfleet.strategies.utils import apply_to_tensors, move_to_device, normalize_op

if TYPE_CHECKING:
    from torchfleet.environments.base import ClusterEnvironment
    from torchfleet.precision import Precision

#: the forms XLAStrategy runs in (``mode=``)
MODES = ("launch", "spmd")
#: the precisions XLA runs (Lightning's XLAPrecision offers the same "true" ones; XLA has no loss scaler)
PRECISIONS = ("32-true", "bf16-true", "16-true")


def _check_precision(precision: Precision) -> None:
    name = getattr(precision, "name", None)
    if name not in PRECISIONS:
        raise ConfigurationError(
            f"precision={name!r} is not supported by XLAStrategy: XLA runs {', '.join(map(repr, PRECISIONS))} "
            "(the whole model in that dtype; bf16-true is XLA's usual half precision). Mixed precision "
            "(autocast with a loss scaler) is not offered on XLA here."
        )


class XLAStrategy(Strategy):
    """Train on XLA devices: ``mode="launch"`` (one replica per device) or ``mode="spmd"`` (one process, a mesh).

    ``parallel_devices``: the XLA devices (default: those ``devices=`` selects). ``debug=True`` sets
    ``PT_XLA_DEBUG=1`` for the run (Lightning's ``strategy="xla_debug"``). ``sync_module_states`` (launch): the
    replicas start from global ordinal 0's parameters. ``start_method`` (launch): how torch_xla starts its
    processes, "fork" (Lightning's choice; works from notebooks) or "spawn".
    """

    requires_package = "torch_xla"
    #: the replicas share no torch.distributed group (on the CPU backend they are threads of one process)
    agrees_on_signals = False

    @takes("accelerator", "parallel_devices", "checkpoint_io", "precision_plugin", "debug", "sync_module_states",
           "mode", "precision", "start_method")
    def __init__(self, given: dict[str, Any], debug: bool = False, sync_module_states: bool = True,
                 mode: str = "launch", start_method: str = "fork") -> None:
        if mode not in MODES:
            raise ConfigurationError(
                f"XLAStrategy(mode={mode!r}) is not valid: give 'launch' (one replica per XLA device, started by "
                "torch_xla as Lightning's strategy='xla') or 'spmd' (one process, the batch sharded over a mesh of "
                "every device)."
            )
        check_flag("debug", debug, owner="XLAStrategy")
        check_flag("sync_module_states", sync_module_states, owner="XLAStrategy")
        if start_method not in ("fork", "spawn"):
            raise ConfigurationError(
                f"XLAStrategy(start_method={start_method!r}) is not valid: torch_xla starts its processes with "
                "'fork' (the default) or 'spawn'."
            )
        if not xla_installed():
            raise xla_not_installed(f"XLAStrategy(mode={mode!r})")
        parallel = given.pop("parallel_devices")
        super().__init__(**given)
        if self.has_part("precision"):
            _check_precision(self._precision)
        self.mode = mode
        self.debug = debug
        self.sync_module_states = sync_module_states
        self.start_method = start_method
        self.parallel_devices: list[torch.device] | None = list(parallel) if parallel is not None else None
        self._launched = False  # inside a replica (launch) or set up (spmd)
        self._mesh: Any = None
        self._sync_gradients = True

    @classmethod
    def unusable_here(cls, cuda: bool) -> str | None:
        return None if xla_installed() else "needs torch_xla (pip install torch==2.9.1 torch_xla==2.9.0)"

    # ------------------------------------------------------------------ parts
    @property  # type: ignore[override]
    def precision(self) -> Precision:
        return self._precision

    @precision.setter
    def precision(self, precision: Precision) -> None:
        _check_precision(precision)
        self._precision = precision

    precision_plugin = precision

    def configure(self, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment) -> None:
        if num_nodes != 1:
            raise ConfigurationError(
                f"XLAStrategy with num_nodes={num_nodes}: a TPU pod's hosts are started by torch_xla's own tooling, "
                "which torchfleet does not drive; use num_nodes=1 (one host, every device on it)."
            )
        if self.parallel_devices is None:
            self.parallel_devices = list(devices)
        if any(torch.device(d).type != "xla" for d in self.parallel_devices):
            raise ConfigurationError(
                f"XLAStrategy runs on XLA devices, but was given {[str(d) for d in self.parallel_devices]}. Use "
                "accelerator='xla' (or 'tpu') with it."
            )
        self.cluster_environment = cluster_environment
        if self.mode == "launch":
            from torchfleet.launchers.xla import XLALauncher

            self._launcher = XLALauncher(len(self.parallel_devices), self.start_method)

    @property
    def requested_device_type(self) -> str | None:
        return "xla"

    # --------------------------------------------------------------- topology
    @property
    def root_device(self) -> torch.device:
        if self._launched:
            import torch_xla

            return torch_xla.device()
        # before the replicas start, the runtime must not start (torch_xla's launcher refuses it then)
        return torch.device("xla", 0)

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices or ()) if self.mode == "launch" else 1

    @property
    def world_size(self) -> int:
        if self.mode == "spmd":
            return 1
        if self._launched:
            from torch_xla import runtime

            return int(runtime.world_size())
        return self.num_processes

    @property
    def global_rank(self) -> int:
        if self.mode == "launch" and self._launched:
            from torch_xla import runtime

            return int(runtime.global_ordinal())
        return 0

    @property
    def local_rank(self) -> int:
        if self.mode == "launch" and self._launched:
            from torch_xla import runtime

            return int(runtime.local_ordinal())
        return 0

    @property
    def device_ids(self) -> list[int]:
        return [d.index if d.index is not None else i for i, d in enumerate(self.parallel_devices or [])]

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        if self.mode == "spmd" or self.world_size == 1:
            return None
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    @property
    def mesh(self) -> Any:
        """The SPMD device mesh (``torch_xla.distributed.spmd.Mesh``, axis "data"); None in launch mode."""
        return self._mesh

    # ------------------------------------------------------------------ setup
    def setup_environment(self) -> None:
        if self.debug:
            os.environ["PT_XLA_DEBUG"] = "1"
        if self.mode == "spmd":
            self._setup_spmd()
        else:
            from torchfleet.rank_zero import rank_zero_only

            self._launched = True
            rank_zero_only.rank = self.global_rank
        if self.accelerator is not None:
            self.accelerator.setup_device(self.root_device)

    def _setup_spmd(self) -> None:
        import numpy as np
        import torch_xla.distributed.spmd as xs
        from torch_xla import runtime

        runtime.use_spmd()
        count = int(runtime.global_runtime_device_count())
        wanted = len(self.parallel_devices or ())
        if wanted != count:
            raise ConfigurationError(
                f"XLAStrategy(mode='spmd') shards over every device of the runtime ({count} here), but devices={wanted} "
                f"was asked for. Use devices={count} (or 'auto'), or change the runtime's device count (on the CPU "
                "backend: CPU_NUM_DEVICES)."
            )
        self._mesh = xs.Mesh(np.arange(count), (count,), ("data",))
        self._launched = True

    def setup_module(self, module: nn.Module) -> nn.Module:
        if self.mode == "launch" and self.sync_module_states and self.world_size > 1:
            import torch_xla.core.xla_model as xm

            xm.broadcast_master_param(module)
        return module

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Move the batch to the XLA device; under SPMD every tensor is also sharded along its first dimension."""
        batch = super().batch_to_device(batch, device, dataloader_idx)
        if self.mode != "spmd" or self._mesh is None:
            return batch
        import torch_xla.distributed.spmd as xs

        def shard(tensor: Tensor) -> Tensor:
            if tensor.dim() >= 1 and tensor.device.type == "xla":
                xs.mark_sharding(tensor, self._mesh, ("data",) + (None,) * (tensor.dim() - 1))
            return tensor

        return apply_to_tensors(batch, shard)

    # --------------------------------------------------------------- training
    def _sync(self) -> None:
        """Compile and run what the step recorded (``torch_xla.sync``) and wait for it (every replica calls it)."""
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()  # a collective of the replicas where they share a process (launchers/xla.py)
        if self.mode == "launch":
            # this replica's device: another replica's next program may already wait in its all-reduce for this one
            xm.wait_device_ops(torch_xla._XLAC._xla_real_devices([torch_xla._XLAC._xla_get_default_device()]))
        else:
            xm.wait_device_ops()

    def run_backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        super().run_backward(tensor, module, *args, **kwargs)
        if self.mode == "launch" and self._sync_gradients and self.world_size > 1:
            import torch_xla.core.xla_model as xm

            source = module if module is not None else self.model
            grads = [p.grad for p in (source.parameters() if source is not None else ()) if p.grad is not None]
            if grads:
                xm.all_reduce(xm.REDUCE_SUM, grads, scale=1.0 / self.world_size)

    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Any:
        import contextlib

        @contextlib.contextmanager
        def skipping() -> Any:
            previous, self._sync_gradients = self._sync_gradients, not enabled
            try:
                yield
            finally:
                self._sync_gradients = previous

        return skipping()

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None,
                       model: nn.Module | None = None, **kwargs: Any) -> Any:
        result = super().optimizer_step(optimizer, closure, model, **kwargs)
        self._sync()
        return result

    # ------------------------------------------------------------ collectives
    def _collective_ready(self) -> bool:
        return self.mode == "launch" and self._launched and self.world_size > 1

    def reduce(self, tensor: Tensor | Any, group: Any | None = None, reduce_op: Any = "mean") -> Tensor | Any:
        op = normalize_op(reduce_op)
        if not self._collective_ready():
            return tensor
        import torch_xla.core.xla_model as xm

        if not isinstance(tensor, Tensor):
            tensor = torch.tensor(float(tensor))
        original = tensor.device
        out = tensor.detach().to(self.root_device)
        if not out.is_floating_point() and op == "mean":
            out = out.float()
        kind = {"mean": xm.REDUCE_SUM, "sum": xm.REDUCE_SUM, "max": xm.REDUCE_MAX, "min": xm.REDUCE_MIN}[op]
        out = xm.all_reduce(kind, out, scale=1.0 / self.world_size if op == "mean" else 1.0)
        self._sync()  # the all-reduce runs now, in a program compiled as the step's are
        return out.to(original)

    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        if not self._collective_ready():
            return tensor.unsqueeze(0)
        original = tensor.device
        if sync_grads:
            import torch_xla.core.functions as xf

            return xf.all_gather(tensor.to(self.root_device).unsqueeze(0)).to(original)
        return self._gather(tensor.detach()).to(original)

    def _gather(self, tensor: Tensor) -> Tensor:
        """Every replica's ``tensor`` stacked, through one all-reduce whose program is the same in every replica.

        Each replica places its tensor in its own row (a one-hot row mask sent as device data, not as a constant):
        torch_xla's all_gather pads by the replica's ordinal, so replicas sharing a process would compile
        different programs, whose all-reduces do not meet on XLA's CPU backend.
        """
        import torch_xla.core.xla_model as xm

        mask = torch.zeros(self.world_size, dtype=tensor.dtype)
        mask[self.global_rank] = 1
        rows = xm.send_cpu_data_to_device(mask, self.root_device)[0]
        value = tensor.to(self.root_device)
        placed = rows.view(-1, *([1] * value.dim())) * value.unsqueeze(0)
        out = xm.all_reduce(xm.REDUCE_SUM, placed)
        self._sync()
        return out

    def _exchange(self, obj: Any) -> list[Any]:
        """Every replica's picklable ``obj``, in rank order (bytes carried as float32 values, exact up to 255)."""
        payload = torch.tensor(list(pickle.dumps(obj)), dtype=torch.float32)
        sizes = [int(n) for n in self._gather(torch.tensor([float(payload.numel())])).cpu().view(-1)]
        padded = torch.zeros(max(sizes), dtype=torch.float32)
        padded[: payload.numel()] = payload
        rows = self._gather(padded).cpu().to(torch.uint8)
        return [pickle.loads(bytes(row[:n].tolist())) for row, n in zip(rows, sizes)]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not self._collective_ready():
            return obj
        return self._exchange(obj)[src]

    def all_gather_object(self, obj: Any, name: str | None = None) -> list[Any]:
        if not self._collective_ready():
            return [obj]
        return self._exchange(obj)

    def barrier(self, name: str | None = None) -> None:
        if not self._collective_ready():
            return
        self._gather(torch.zeros(1))

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        if not self._collective_ready():
            return bool(decision)
        votes = self.reduce(torch.tensor(int(decision)), reduce_op="sum")
        return bool(int(votes) == self.world_size) if all else bool(int(votes) > 0)

    # --------------------------------------------------------------- checkpoints
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: str | os.PathLike,
                        storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` on the host in torchfleet's format: pending device work done, every tensor on the CPU."""
        if self._launched:
            self._sync()
        on_host = move_to_device(checkpoint, torch.device("cpu"))
        super().save_checkpoint(on_host, filepath, storage_options=storage_options)

    def teardown(self) -> None:
        if self._launched:
            self._sync()
        super().teardown()
        if self.debug:
            os.environ.pop("PT_XLA_DEBUG", None)

    def __repr__(self) -> str:
        return f"XLAStrategy(mode={self.mode!r}, precision={self._precision!r})"
