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

* Whatever the caller collects per replica: ``replica_hooks`` (given to ``configure_training``)
  ``enter`` runs in each replica's thread on that replica's copy of the module, and ``merge`` in
  the main thread afterwards with what each replica collected. The Trainer's hooks record
  ``self.log`` calls per replica and log them once (trainer/replica_logging.py); this strategy
  knows nothing of logging.
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
from torchfleet.strategies.arguments import takes
from torchfleet.strategies.single_device import _as_device
from torchfleet.strategies.strategy import Strategy

if TYPE_CHECKING:
    from torchfleet.environments.base import ClusterEnvironment
    from torchfleet.settings import ReplicaHooks


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

    @classmethod
    def unusable_here(cls, cuda: bool) -> str | None:
        # the connector refuses dp without CUDA devices: it is torch.nn.DataParallel over GPUs
        return None if cuda else "needs CUDA GPUs (none here); on the CPU use ddp"

    @takes("accelerator", "parallel_devices", "checkpoint_io", "precision", "precision_plugin")
    def __init__(self, given: dict[str, Any], parallel_devices: Sequence[str | torch.device | int] | None = None) -> None:
        super().__init__(**given)
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
        return _HookParallel(user, name, module, self.replica_hooks)

    #: DataParallel computes on the other devices only inside its forward; gradients computed outside stay partial
    outside_forward = "without_grad"

    def forward_method(self, module: nn.Module, name: str) -> Callable[..., Any]:
        """``name`` run on every replica, through DataParallel's scatter and gather (as the steps are)."""
        user = self.unwrap(module)
        if not isinstance(module, nn.DataParallel) or not module.device_ids:
            return getattr(user, name)
        return _HookParallel(user, name, module, self.replica_hooks)


# ---------------------------------------------------------------- the hook on every replica
class _HookRedirect(nn.Module):
    """A module whose forward calls ``self.module.<hook>``, so DataParallel (which calls forward) runs the hook.

    DataParallel replicates this module and the user's module inside it together: on each
    replica ``self.module`` is that replica's copy. On a replica (several devices),
    ``replica_hooks.enter`` runs on that copy before the hook (in the replica's thread) and what
    it returns comes back with the output, for the main thread to ``merge``.
    """

    def __init__(self, module: nn.Module, hook: str, replica_hooks: ReplicaHooks | None = None) -> None:
        super().__init__()
        self.module = module
        self.hook = hook
        self.replica_hooks = replica_hooks

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        if not getattr(self, "_is_replica", False):  # one device: DataParallel calls the original, no threads
            return getattr(module, self.hook)(*args, **kwargs)
        # the replica has its own copy of the module's attribute dict: what enter changes stays on this replica
        collected = self.replica_hooks.enter(module) if self.replica_hooks is not None else None
        return _ReplicaResult(getattr(module, self.hook)(*args, **kwargs), collected)


@dataclass
class _ReplicaResult:
    """What one replica returns: the hook's output and what ``replica_hooks.enter`` collected there (or None)."""

    output: Any
    collected: Any


class _HookParallel(nn.DataParallel):
    """DataParallel over a ``_HookRedirect``: every call runs one hook on every replica.

    Built by ``step_function`` with the device settings of the module wrapped by ``setup_module``.
    """

    def __init__(self, user_module: nn.Module, hook: str, like: nn.DataParallel,
                 replica_hooks: ReplicaHooks | None = None) -> None:
        # a DataParallel built where torch saw no GPU has neither output_device nor dim
        super().__init__(
            _HookRedirect(user_module, hook, replica_hooks), device_ids=like.device_ids,
            output_device=getattr(like, "output_device", None), dim=getattr(like, "dim", 0),
        )
        self.hook = hook

    def gather(self, outputs: Any, output_device: int | torch.device) -> Any:
        redirect = self.module
        hooks = redirect.replica_hooks
        device = torch.device("cuda", output_device) if isinstance(output_device, int) else torch.device(output_device)
        merge = None if hooks is None else (lambda collected: hooks.merge(redirect.module, collected, device))
        return combine_replica_outputs(
            outputs, self.hook, merge, lambda outs: nn.DataParallel.gather(self, outs, output_device)
        )


# ---------------------------------------------------------------- combining the replicas' results
def combine_replica_outputs(
    replica_results: Sequence[_ReplicaResult],
    hook: str,
    merge: Callable[[list[Any]], None] | None,
    gather: Callable[[list[Any]], Any],
) -> Any:
    """One output from the replicas' ``_ReplicaResult``s, in replica order.

    What the replicas collected (the non-None values, in replica order) goes to ``merge`` first,
    when given. The outputs are passed to ``gather`` (DataParallel's gather onto the output
    device) with 0-dim tensors made 1-element vectors first (what DataParallel does itself, minus
    its warning). For training_step, a loss that was a single number on every replica is then
    averaged into one 0-dim loss.
    """
    outputs = [r.output for r in replica_results]
    if merge is not None:
        merge([r.collected for r in replica_results if r.collected is not None])
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
