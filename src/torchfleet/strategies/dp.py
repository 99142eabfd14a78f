"""DataParallelStrategy: one process drives several CUDA devices through ``torch.nn.DataParallel``.

Every step, DataParallel scatters the batch across the devices, copies the module onto each of
them (the replicas), runs the replicas in threads and gathers their outputs on the first device.
Gradients flow back into the one original module, so there is one optimizer and one process.

Why this class derives from ``Strategy`` and not ``ParallelStrategy``: ParallelStrategy is one
process *per device* joined in a torch.distributed group; its world size and ranks come from the
cluster environment and its collectives call torch.distributed. dp has none of that. It is a
single process, so ``world_size`` is 1, ``global_rank`` is 0 and the collectives (``reduce``,
``all_gather``, ``broadcast``, ``barrier``) are the identities that ``Strategy`` already
provides. Deriving from Strategy gives exactly that with nothing to switch off.

How a hook such as ``training_step`` runs on the replicas: DataParallel only ever calls
``forward``. For each hook, ``step_function`` builds a ``DataParallel`` (``_HookParallel``)
around a tiny ``_HookRedirect`` module whose forward calls ``getattr(self.module, hook)``. The
redirect holds the user's module as a child, so DataParallel replicates both together and on
every replica ``self.module`` is that replica's own copy. Nothing is patched on the shared
module and no per-call state is written that threads could race on.

What comes back from the replicas:

* ``self.log`` inside a replica does not write to the Trainer's shared Results from several
  threads: each replica records its calls in its own ``_ReplicaLog``; after the replicas finish,
  the main thread combines each logged name across replicas with the call's ``reduce_fx`` (as if
  every replica's chunk were one batch: a weighted mean when ``batch_size`` was given, else a
  plain mean; a sum; a max; a min) and logs the result once.
* A training_step loss that is a single number on every replica comes back as one number: the
  per-device losses are gathered into a vector and averaged (``mean_replica_loss``), for a plain
  tensor and for the ``"loss"`` entry of a dict. A loss that is not a single number is left as
  gathered, so the Trainer still reports it.
* Everything else is gathered as ``torch.nn.DataParallel`` does: tensors are concatenated along
  dim 0 on the first device; a 0-dim tensor becomes a vector with one entry per replica.

Manual optimization is refused: training_step would call ``optimizer.step()`` once per replica,
concurrently, from the replica threads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from torchfleet.errors import ConfigurationError
from torchfleet.strategies.base import Strategy, _as_device

if TYPE_CHECKING:
    from torchfleet.accelerators.base import Accelerator
    from torchfleet.checkpoint.io import CheckpointIO
    from torchfleet.environments.base import ClusterEnvironment
    from torchfleet.precision import Precision


def _describe(devices: Sequence[torch.device]) -> str:
    return ", ".join(repr(str(d)) for d in devices) if devices else "no device"


def _check_cuda_devices(devices: Sequence[torch.device]) -> None:
    """Raise the one-paragraph dp error unless ``devices`` is a non-empty list of distinct CUDA devices."""
    if not devices or any(d.type != "cuda" for d in devices):
        raise ConfigurationError(
            f"strategy='dp' needs CUDA devices, but the devices to use are {_describe(devices)}. dp runs "
            "torch.nn.DataParallel: one process that splits every batch across several CUDA devices of one "
            "machine, so it is not available on the CPU or on MPS. To train with several processes on the CPU, "
            "use strategy='ddp' (multi-process; it works on the CPU with the gloo backend), e.g. "
            "Trainer(accelerator='cpu', devices=2, strategy='ddp'); for one process use strategy='auto'. On "
            "GPUs, strategy='ddp' is also faster than 'dp'."
        )
    seen: set[int | None] = set()
    for d in devices:
        if d.index in seen:
            raise ConfigurationError(
                f"strategy='dp' was given the devices {_describe(devices)}, which list cuda:{d.index} twice. "
                "Give each CUDA device once."
            )
        seen.add(d.index)


def _as_cuda_device(device: str | torch.device | int) -> torch.device:
    device = _as_device(device)
    # torch.device("cuda") means "the current device", which is 0 in a process that set none
    return torch.device("cuda", 0) if device.type == "cuda" and device.index is None else device


class DataParallelStrategy(Strategy):
    """Train in one process on several CUDA devices of one machine with ``torch.nn.DataParallel``.

    ``parallel_devices`` are the CUDA devices to split each batch across (default: the ones
    ``devices=`` selects). The first one is the root device: the module's parameters, the
    optimizer state and the gathered outputs live there. The process count and world size
    are 1, so every collective is an identity. ``strategy='ddp'`` is faster on GPUs and also
    runs on the CPU; use dp where a single process is required.
    """

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: Sequence[str | torch.device | int] | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
    ) -> None:
        super().__init__(accelerator=accelerator, precision=precision, checkpoint_io=checkpoint_io)
        self.parallel_devices: list[torch.device] | None = None
        if parallel_devices is not None:
            devices = [_as_cuda_device(d) for d in parallel_devices]
            _check_cuda_devices(devices)
            self.parallel_devices = devices

    def configure(self, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment) -> None:
        """Take ``devices`` (unless devices were given to the constructor); refuse several nodes and non-CUDA devices."""
        if num_nodes != 1:
            raise ConfigurationError(
                f"strategy='dp' runs in one process on one machine (torch.nn.DataParallel), so num_nodes={num_nodes} "
                f"cannot be used with it. Use strategy='ddp' to train on {num_nodes} machines, or num_nodes=1."
            )
        if self.parallel_devices is None:
            given = [_as_cuda_device(d) for d in devices]
            _check_cuda_devices(given)
            self.parallel_devices = given

    # --------------------------------------------------------------- topology
    @property
    def root_device(self) -> torch.device:
        if not self.parallel_devices:
            raise RuntimeError(
                "DataParallelStrategy has no devices yet: pass parallel_devices=[...] or let the Trainer/Fleet "
                "configure it (torchfleet.connector.resolve) before reading root_device."
            )
        return self.parallel_devices[0]

    @property
    def device_ids(self) -> list[int]:
        """Indices of the CUDA devices each batch is split across (root first)."""
        return [d.index or 0 for d in self.parallel_devices or []]

    # ------------------------------------------------------------------ setup
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Wrap ``module`` (already on the root device) in ``torch.nn.DataParallel`` over ``device_ids``."""
        return nn.DataParallel(module, device_ids=self.device_ids)

    def unwrap(self, module: nn.Module) -> nn.Module:
        return module.module if isinstance(module, nn.DataParallel) else module

    def step_function(self, module: nn.Module, name: str) -> Callable[..., Any]:
        """Run the user module's ``name`` hook on every replica, through DataParallel's scatter and gather."""
        user = self.unwrap(module)
        if name == "training_step" and not getattr(user, "automatic_optimization", True):
            raise ConfigurationError(
                f"strategy='dp' cannot run {type(user).__name__} with automatic_optimization=False: dp runs "
                "training_step on one replica per device, in threads, so optimizer steps and manual_backward "
                "inside it would run once per device, concurrently. Use strategy='ddp', or automatic optimization."
            )
        if not isinstance(module, nn.DataParallel) or not module.device_ids:
            # not wrapped by setup_module, or torch saw no GPU when wrapping (DataParallel then only
            # calls the module): nothing to split across
            return getattr(user, name)
        return _HookParallel(user, name, module)


# ---------------------------------------------------------------- the hook on every replica
class _HookRedirect(nn.Module):
    """A module whose forward calls ``self.module.<hook>``, so DataParallel (which calls forward) runs the hook.

    DataParallel replicates this module and the user's module inside it together: on each
    replica ``self.module`` is that replica's copy. On a replica (several devices), the hook's
    ``self.log`` calls are recorded in a ``_ReplicaLog`` of the replica's own and returned with
    the output, for the main thread to combine; the original module's Results is never touched
    from a replica thread.
    """

    def __init__(self, module: nn.Module, hook: str) -> None:
        super().__init__()
        self.module = module
        self.hook = hook

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        if not getattr(self, "_is_replica", False):  # one device: DataParallel calls the original, no threads
            return getattr(module, self.hook)(*args, **kwargs)
        log = None
        if getattr(module, "_results", None) is not None:
            log = _ReplicaLog()
            # the replica has its own copy of the module's attribute dict: the original keeps its Results
            module._results = log
        return _ReplicaResult(getattr(module, self.hook)(*args, **kwargs), log)


@dataclass
class _ReplicaResult:
    """What one replica returns: the hook's output and what the hook logged there (None: nothing to record)."""

    output: Any
    log: _ReplicaLog | None


class _ReplicaLog:
    """Stands in for the Trainer's Results inside one replica: records ``self.log`` calls, logs nothing.

    ``log`` takes the arguments of ``torchfleet.trainer.logging.Results.log``, which Module.log calls.
    """

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def log(
        self,
        fx: str,
        name: str,
        value: Any,
        prog_bar: bool,
        logger: bool,
        on_step: bool | None,
        on_epoch: bool | None,
        reduce_fx: Any,
        sync_dist: bool,
        batch_size: int | None,
    ) -> None:
        self.calls.append(
            dict(fx=fx, name=name, value=value, prog_bar=prog_bar, logger=logger, on_step=on_step,
                 on_epoch=on_epoch, reduce_fx=reduce_fx, sync_dist=sync_dist, batch_size=batch_size)
        )


class _HookParallel(nn.DataParallel):
    """DataParallel over a ``_HookRedirect``: every call runs one hook on every replica.

    Built by ``step_function`` with the device settings of the module wrapped by ``setup_module``.
    """

    def __init__(self, user_module: nn.Module, hook: str, like: nn.DataParallel) -> None:
        # a DataParallel built where torch saw no GPU has neither output_device nor dim
        super().__init__(
            _HookRedirect(user_module, hook), device_ids=like.device_ids,
            output_device=getattr(like, "output_device", None), dim=getattr(like, "dim", 0),
        )
        self.hook = hook

    def gather(self, outputs: Any, output_device: int | torch.device) -> Any:
        redirect = self.module
        results = getattr(redirect.module, "_results", None)
        device = torch.device("cuda", output_device) if isinstance(output_device, int) else torch.device(output_device)
        return combine_replica_outputs(
            outputs, self.hook, results, device, lambda outs: nn.DataParallel.gather(self, outs, output_device)
        )


# ---------------------------------------------------------------- combining the replicas' results
def combine_replica_outputs(
    replica_results: Sequence[_ReplicaResult],
    hook: str,
    results: Any,
    device: torch.device,
    gather: Callable[[list[Any]], Any],
) -> Any:
    """One output from the replicas' ``_ReplicaResult``s, in replica order.

    What each replica logged is combined and logged once into ``results`` (when not None) on
    ``device``. The outputs are passed to ``gather`` (DataParallel's gather onto the output
    device) with 0-dim tensors made 1-element vectors first (what DataParallel does itself, minus
    its warning). For training_step, a loss that was a single number on every replica is then
    averaged into one 0-dim loss.
    """
    outputs = [r.output for r in replica_results]
    if results is not None:
        replay_replica_logs([r.log for r in replica_results if r.log is not None], results, device)
    single_losses = hook == "training_step" and all(_is_single_number_loss(o) for o in outputs)
    gathered = gather([_scalars_as_vectors(o) for o in outputs])
    return mean_replica_loss(gathered) if single_losses else gathered


def _loss_of(output: Any) -> Any:
    if isinstance(output, Mapping):
        return output.get("loss")
    return output


def _is_single_number_loss(output: Any) -> bool:
    loss = _loss_of(output)
    return isinstance(loss, Tensor) and loss.numel() == 1


def _scalars_as_vectors(data: Any) -> Any:
    """``data`` with every 0-dim tensor inside dicts, lists, tuples and namedtuples reshaped to shape (1,)."""
    if isinstance(data, Tensor):
        return data.reshape(1) if data.dim() == 0 else data
    if isinstance(data, dict):
        return type(data)((k, _scalars_as_vectors(v)) for k, v in data.items())
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*[_scalars_as_vectors(v) for v in data])
    if isinstance(data, (list, tuple)):
        return type(data)(_scalars_as_vectors(v) for v in data)
    return data


def mean_replica_loss(output: Any) -> Any:
    """A training_step output whose loss holds one value per replica, with the loss averaged to a 0-dim tensor.

    ``output`` is the loss tensor itself or a mapping with a ``"loss"`` tensor (a new mapping of
    the same type is returned; the other entries are unchanged). Anything else is returned as is.
    """
    if isinstance(output, Tensor):
        return output.mean()
    if isinstance(output, Mapping) and isinstance(output.get("loss"), Tensor):
        reduced = dict(output)
        reduced["loss"] = output["loss"].mean()
        return reduced if type(output) is dict else type(output)(reduced)
    return output


def _as_number_tensor(value: Any, device: torch.device) -> Tensor | None:
    """``value`` as a 0-dim float tensor on ``device``; None when it is not a single number."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            return None
        value = value.detach().reshape(())
        return (value if value.is_floating_point() else value.float()).to(device)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value), device=device)
    return None


def replay_replica_logs(logs: Sequence[_ReplicaLog], results: Any, device: torch.device) -> None:
    """Log into ``results`` once per name what the replicas' ``logs`` recorded, combined with each name's reduce_fx.

    The replicas' values are treated as values of smaller batches: "mean" averages them (weighted
    by ``batch_size`` when every call gave one, which is then summed), "sum" adds them, "max" and
    "min" take the extreme. The options of the first call of a name are used. A value that is not
    a single number is handed to ``results`` as is, so it raises its usual error.
    """
    from torchfleet.trainer.logging import normalize_reduce_fx

    by_name: dict[str, list[dict[str, Any]]] = {}
    for log in logs:
        for call in log.calls:
            by_name.setdefault(call["name"], []).append(call)
    for calls in by_name.values():
        first = calls[0]
        values = [_as_number_tensor(c["value"], device) for c in calls]
        if any(v is None for v in values):
            bad = next(c for c, v in zip(calls, values) if v is None)
            results.log(**bad)  # Results explains what it accepts
            continue
        stacked = torch.stack(values)  # type: ignore[arg-type]
        sizes = [c["batch_size"] for c in calls]
        all_sized = all(s is not None for s in sizes)
        fx = normalize_reduce_fx(first["reduce_fx"])
        if fx == "mean":
            if all_sized and sum(sizes) > 0:
                weights = torch.tensor([float(s) for s in sizes], device=device)
                value = (stacked * weights).sum() / weights.sum()
            else:
                value = stacked.mean()
        elif fx == "sum":
            value = stacked.sum()
        elif fx == "max":
            value = stacked.max()
        else:
            value = stacked.min()
        results.log(**{**first, "value": value, "batch_size": sum(sizes) if all_sized else None})
