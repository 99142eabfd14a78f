"""Strategy: one Accelerator, one Precision, one CheckpointIO (and, for parallel ones, a ClusterEnvironment).

The Trainer and Fleet drive training only through the methods here; anything that differs between
single-device, data-parallel and sharded training is a method that a subclass overrides.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.checkpoint.consolidate import read_full_checkpoint
from torchfleet.checkpoint.io import TorchCheckpointIO, load_through
from torchfleet.checkpoint.state import (
    MODULE,
    load_state_dict_checked,
    map_stateful,
    paired_optimizer_states,
    stateful_entries,
)
from torchfleet.errors import ConfigurationError
from torchfleet.settings import TrainingSettings
from torchfleet.strategies.utils import (
    ReduceOp,
    _check_op,
    apply_to_tensors,
    creation_context,
    move_to_device,
)
from torchfleet.watchdog import labelled

if TYPE_CHECKING:
    from torchfleet.accelerators.base import Accelerator
    from torchfleet.checkpoint.io import CheckpointIO
    from torchfleet.environments.base import ClusterEnvironment
    from torchfleet.launchers.base import Launcher
    from torchfleet.precision import Precision
    from torchfleet.settings import ReplicaHooks


#: ``Strategy.outside_forward`` values. "allowed": calling the module's parameters outside the wrapper's forward is the
#: same as inside (one device). "without_grad": fine without gradients, but gradients computed there are not
#: synchronised between processes (ddp, dp, ZeRO 1-2). "never": the parameters exist whole only inside forward
#: (fsdp, ZeRO-3).
OUTSIDE_FORWARD = ("allowed", "without_grad", "never")


class Strategy(ABC):
    """How a model is placed, wrapped, stepped, synchronised and checkpointed.

    A Strategy holds exactly one Accelerator, one Precision and one CheckpointIO. Each can be
    passed to the constructor, or is filled in by ``torchfleet.connector.resolve`` from the
    Trainer's or Fleet's arguments. Collectives (``reduce``, ``all_gather``, ``broadcast``,
    ``barrier``, ``reduce_boolean_decision``) exist on every strategy; on one process they are
    identities, so user code runs unchanged everywhere.
    """

    #: whether ``backward`` runs through the precision (and so through a Module's ``backward`` override)
    backward_through_precision = True
    #: the clients ("trainer", "fleet") that call ``reset_seed()`` as they set this strategy's environment up, as
    #: Lightning's strategy of the same kind does (Trainer: ddp, fsdp, deepspeed; Fabric: fsdp, deepspeed), so that
    #: random numbers drawn between ``seed_everything`` and the run do not shift the run
    reseeds_for: frozenset[str] = frozenset()
    #: the optional package this strategy runs on (``torchfleet strategies`` says when it is not installed)
    requires_package: str | None = None

    @classmethod
    def unusable_here(cls, cuda: bool) -> str | None:
        """Why this strategy cannot run on this machine (``cuda``: CUDA devices can be used), None when it can.

        ``torchfleet strategies`` shows it, and a misspelt strategy name is not pointed at a strategy that has one.
        """
        return None

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        from torchfleet.precision import Precision as _FullPrecision

        precision = _precision_alias(precision, precision_plugin)
        self._explicit = {k for k, v in (("accelerator", accelerator), ("precision", precision),
                                         ("checkpoint_io", checkpoint_io)) if v is not None}
        self._accelerator = accelerator
        # never None, so the per-step methods below read it without a check
        self._precision: Precision = precision if precision is not None else _FullPrecision()
        self._checkpoint_io = checkpoint_io
        self._launcher: Launcher | None = None

    # ------------------------------------------------------------------ parts
    @property
    def accelerator(self) -> Accelerator | None:
        return self._accelerator

    @accelerator.setter
    def accelerator(self, accelerator: Accelerator | None) -> None:
        self._accelerator = accelerator

    @property
    def precision(self) -> Precision:
        return self._precision

    @precision.setter
    def precision(self, precision: Precision) -> None:
        self._precision = precision

    @property
    def precision_plugin(self) -> Precision:
        """Lightning's name for :attr:`precision` (the same object)."""
        return self._precision

    @property
    def checkpoint_io(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            self._checkpoint_io = TorchCheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO | None) -> None:
        self._checkpoint_io = io

    def has_part(self, kind: str) -> bool:
        """Whether the part ``kind`` ("accelerator", "precision", "checkpoint_io", ...) was given to the constructor."""
        return kind in self._explicit

    @property
    def launcher(self) -> Launcher | None:
        """What starts the processes; None when this process is the whole run."""
        return self._launcher

    def configure(self, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment) -> None:
        """Receive the resolved devices for this node, the node count and the cluster environment."""

    @property
    def requested_device_type(self) -> str | None:
        """The device type the constructor fixed (``SingleDeviceStrategy(device="cpu")``); None when not given.

        With ``accelerator="auto"`` that type decides the accelerator, so a strategy built for the
        CPU stays on the CPU on a machine with a GPU.
        """
        return None

    # --------------------------------------------------------------- topology
    @property
    @abstractmethod
    def root_device(self) -> torch.device:
        """The device this process computes on."""

    @property
    def world_size(self) -> int:
        return 1

    @property
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def num_nodes(self) -> int:
        return 1

    @property
    def num_processes(self) -> int:
        """Processes per node."""
        return 1

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def device_ids(self) -> list[int]:
        """Indices of the devices used on this node (CPU: one entry per process)."""
        return [0]

    # ------------------------------------------------------------------ setup
    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """``num_replicas`` and ``rank`` for this process's DistributedSampler; None: one process, no sampler."""
        return None

    def setup_environment(self) -> None:
        """Prepare this process: select its device (and, in parallel strategies, join the process group).

        Every launch path (our launchers, torchrun, SLURM, ddp_spawn/fork, one process) passes here in each
        rank: on the CPU it gives the process its share of the cores (``set_threads_per_process``).
        """
        if self.accelerator is not None:
            self.accelerator.setup_device(self.root_device)
        if self.root_device.type == "cpu":
            from torchfleet.accelerators.cpu import set_threads_per_process

            set_threads_per_process(self.num_processes, self.local_rank)

    #: how the caller trains (accumulation, clipping, micro-batch size): see ``configure_training``
    training_settings: TrainingSettings = TrainingSettings()
    #: what a strategy that runs the module's hooks on copies in one process (dp) calls around the copies
    replica_hooks: ReplicaHooks | None = None

    def configure_training(self, settings: TrainingSettings, replica_hooks: ReplicaHooks | None = None) -> None:
        """Receive how the caller trains, before ``setup``: the Trainer's arguments, or Fleet's ``training=``."""
        self.training_settings = settings
        self.replica_hooks = replica_hooks

    def setup(self, module: nn.Module, optimizers: Sequence[Optimizer] = ()) -> tuple[nn.Module, list[Optimizer]]:
        """Convert, place and wrap ``module``; prepare ``optimizers``. Returns the objects to train with."""
        module = self.precision.convert_module(module)
        module = self.module_to_device(module)
        module = self.setup_module(module)
        return module, [self.setup_optimizer(o) for o in optimizers]

    def module_to_device(self, module: nn.Module) -> nn.Module:
        """Place ``module`` on ``root_device``."""
        return module.to(self.root_device)

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Wrap ``module`` for this strategy (DDP, fully_shard, ...). Single device: unchanged."""
        return module

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Adapt an optimizer that was built over the module's parameters (sharded strategies rebuild it)."""
        return optimizer

    def setup_and_build_optimizers(
        self, module: nn.Module, build: Callable[[], list[Optimizer]]
    ) -> tuple[nn.Module, list[Optimizer]]:
        """Set up ``module`` and the optimizers ``build()`` creates over its parameters (the Trainer's order).

        Default: build them first, then ``setup``. Strategies whose wrapping replaces the parameters
        (fsdp) set the module up first, so the optimizers hold the parameters that are trained.
        """
        return self.setup(module, build())

    def module_init_context(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager:
        """Where ``init_module`` creates a model: on ``root_device``, in the precision's parameter dtype.

        ``empty_init`` is for sharded strategies (parameters on the meta device, materialised
        sharded in setup); strategies that hold the whole model ignore it.
        """
        return creation_context(self.root_device, self.precision.param_dtype)

    def release_module(self, module: nn.Module) -> None:
        """Leave the user's ``module`` on the CPU when a Trainer stage ends, as Lightning does.

        The model can then be called with CPU tensors after ``fit``/``predict`` on a GPU, and the
        device's memory is given back. Sharded strategies first make it whole (``unshard_module``).
        """
        if self.root_device.type != "cpu":
            self.unwrap(module).cpu()

    def unshard_module(self, module: nn.Module) -> None:
        """Make the user's module inside ``module`` an ordinary one again: whole weights, none of the strategy's hooks.

        User code can then call it, and any submodule, on any rank alone and gets what the unsharded
        model gives. Sharded strategies gather here, so every rank calls it; here every rank already
        holds the whole model, so there is nothing to do.
        """

    def on_exception(self, exception: BaseException) -> None:
        """A stage raised ``exception`` (called before the stage's end): the ranks may now be anywhere.

        Sharded strategies then leave the module as it is at the stage's end, since making it whole
        would need every rank.
        """

    def outputs_to_cpu(self, outputs: Any) -> Any:
        """``outputs`` (predictions) with every tensor on the CPU, where the caller of ``predict`` can use them."""
        if self.root_device.type == "cpu":
            return outputs
        return move_to_device(outputs, torch.device("cpu"))

    @property
    def supports_inference_mode(self) -> bool:
        """Whether evaluation may run under ``torch.inference_mode`` (else ``torch.no_grad``)."""
        return True

    def unwrap(self, module: nn.Module) -> nn.Module:
        """The user's module inside whatever ``setup_module`` wrapped it in."""
        return module

    def step_function(self, module: nn.Module, name: str) -> Callable[..., Any]:
        """The callable that runs the user module's ``name`` hook ("training_step", ...) through the wrapper.

        Wrappers that synchronise in forward (DDP) override this so the step runs inside their forward.
        """
        return getattr(self.unwrap(module), name)

    #: What running the user's module outside the wrapper's forward does (see ``OUTSIDE_FORWARD``): here nothing
    #: differs, so Fleet lets any method of the module and any submodule be called directly.
    outside_forward: str = "allowed"

    def forward_method(self, module: nn.Module, name: str) -> Callable[..., Any]:
        """A callable that runs the user module's method ``name`` the way the wrapper runs ``forward``.

        Fleet's ``mark_forward_method`` calls it once per method: under DDP the method then runs
        inside DDP's forward (so its gradients are synchronised), under fully_shard inside the
        parameter gathering. One device: the method itself.
        """
        return getattr(self.unwrap(module), name)

    def process_dataloader(self, dataloader: Any, stage: str) -> Any:
        """Adapt a dataloader for this strategy (distributed strategies inject a sampler). Default: unchanged."""
        return dataloader

    def batch_to_device(self, batch: Any, device: torch.device | None = None) -> Any:
        """Move tensors inside ``batch`` to ``device`` (default: ``root_device``) and apply precision."""
        return self._precision.convert_input(move_to_device(batch, device or self.root_device))

    # --------------------------------------------------------------- training
    def forward_context(self) -> contextlib.AbstractContextManager:
        """Context wrapping forward passes (autocast under mixed precision)."""
        return self._precision.forward_context()

    def backward(self, loss: Tensor, module: nn.Module | None = None, *args: Any, **kwargs: Any) -> None:
        """Compute gradients of ``loss`` (through the precision's scaler when there is one)."""
        self._precision.backward(loss, module, *args, **kwargs)

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Step ``optimizer``; ``closure`` computes the loss and gradients first when given."""
        return self._precision.optimizer_step(optimizer, closure, **kwargs)

    def _gradient_params(self, module: nn.Module | None, optimizer: Optimizer | None) -> list[Tensor]:
        if optimizer is not None:
            return [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        assert module is not None
        return [p for p in module.parameters() if p.grad is not None]

    def clip_gradients_norm(
        self,
        module: nn.Module | None,
        optimizer: Optimizer | None,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
    ) -> Tensor:
        """Scale gradients so their total ``norm_type`` norm is at most ``max_norm``; returns the norm before.

        Under a loss scaler (16-mixed) an inf/nan norm is never an error: the scaler skips that step
        and lowers the scale, so ``error_if_nonfinite`` applies only to precisions without one.
        """
        if optimizer is not None:
            self.precision.unscale_gradients(optimizer)
        if error_if_nonfinite and self.precision.skips_nonfinite_steps:
            error_if_nonfinite = False
        params = self._gradient_params(module, optimizer)
        return torch.nn.utils.clip_grad_norm_(
            params, max_norm, norm_type=norm_type, error_if_nonfinite=error_if_nonfinite
        )

    def clip_gradients_value(self, module: nn.Module | None, optimizer: Optimizer | None, clip_val: float) -> None:
        """Clamp every gradient element to ``[-clip_val, clip_val]``."""
        if optimizer is not None:
            self.precision.unscale_gradients(optimizer)
        torch.nn.utils.clip_grad_value_(self._gradient_params(module, optimizer), clip_val)

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """Skip gradient synchronisation inside the block (gradient accumulation). One process: nothing to skip."""
        yield

    # ------------------------------------------------------------ collectives
    def reduce(self, tensor: Tensor | float, op: ReduceOp = "mean", name: str | None = None) -> Tensor | float:
        """Reduce ``tensor`` across all processes with ``op`` (mean, sum, max, min). One process: unchanged.

        ``name`` (on every collective) says what it is for, in hang and desync reports."""
        _check_op(op)
        return tensor

    def all_gather(self, tensor: Tensor, sync_grads: bool = False, name: str | None = None) -> Tensor:
        """Stack ``tensor`` from every process along a new first dimension. One process: ``tensor[None]``."""
        return tensor.unsqueeze(0) if isinstance(tensor, Tensor) else tensor

    def broadcast(self, obj: Any, src: int = 0, name: str | None = None) -> Any:
        """Return rank ``src``'s ``obj`` on every process. One process: ``obj``."""
        return obj

    def all_gather_object(self, obj: Any, name: str | None = None) -> list[Any]:
        """Every process's picklable ``obj``, in rank order. One process: ``[obj]``."""
        return [obj]

    # the user-facing forms (Module, Trainer, Fleet): nested collections of tensors or numbers
    def all_gather_tree(self, data: Any, sync_grads: bool = False, name: str | None = None) -> Any:
        """``all_gather`` every tensor inside ``data`` (nested dicts, lists, tuples)."""
        with labelled(name):  # by label, not argument: subclasses may override all_gather(tensor, sync_grads)
            return apply_to_tensors(data, lambda t: self.all_gather(t, sync_grads=sync_grads))

    def all_reduce_tree(self, data: Any, op: ReduceOp = "mean", name: str | None = None) -> Any:
        """``reduce`` every tensor or number inside ``data`` (nested dicts, lists, tuples) with ``op``."""
        _check_op(op)
        with labelled(name):
            return apply_to_tensors(data, lambda t: self.reduce(t, op=op))

    def barrier(self, name: str | None = None) -> None:
        """Wait until every process reaches this point. One process: returns at once."""

    @contextlib.contextmanager
    def unbounded_barrier(self) -> Iterator[Callable[[], None]]:
        """A barrier without the collectives' timeout, for waits of unknown length (rank 0 downloading a data set).

        Every process enters the block; inside, calling the yielded function waits until every process
        has called it. One process: it returns at once.
        """
        yield _no_wait

    def reduce_boolean_decision(self, decision: bool, all: bool = True, name: str | None = None) -> bool:
        """Agree on a flag across processes: True if ``all`` (or, with all=False, any) of them said True."""
        return bool(decision)

    # ------------------------------------------------------------- checkpoint
    def module_state_dict(self, module: nn.Module) -> dict[str, Any]:
        """The full (unsharded) state dict of the user's module inside ``module``."""
        return self.unwrap(module).state_dict()

    def load_module_state_dict(self, module: nn.Module, state: Mapping[str, Any], strict: bool = True) -> None:
        """Load ``state`` into the user's module inside ``module``."""
        load_state_dict_checked(self.unwrap(module), state, strict=strict)

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer: Optimizer, state: Mapping[str, Any]) -> None:
        optimizer.load_state_dict(state)

    def state_for_saving(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """``state`` with its modules and optimizers replaced by their state dicts (as this strategy saves them)."""
        return map_stateful(state, self.module_state_dict, self.optimizer_state_dict)

    def save_checkpoint(
        self, path: str | os.PathLike, state: Mapping[str, Any], storage_options: Any | None = None
    ) -> None:
        """Write ``state`` to ``path``. Modules and optimizers in ``state`` are turned into state dicts here.

        Every process calls this; the strategy decides who writes (here: rank 0).
        """
        plain = self.state_for_saving(state)
        if self.is_global_zero:
            self.checkpoint_io.save_checkpoint(plain, path, storage_options=storage_options)

    def load_checkpoint(
        self, path: str | os.PathLike, state: Mapping[str, Any] | None = None, strict: bool = True,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Read the checkpoint at ``path``, load it into the modules/optimizers in ``state``, return it whole.

        Nothing in the file runs (``weights_only``); ``weights_only=False`` trusts it. None: the CheckpointIO's setting.
        """
        if os.path.isdir(path):
            # a sharded checkpoint (any layout, any world size), read whole into this process
            checkpoint = read_full_checkpoint(path, weights_only=self.resolve_weights_only(weights_only))
        else:
            checkpoint = load_through(self.checkpoint_io, path, "cpu", weights_only)
        self.load_into(checkpoint, state or {}, strict=strict, path=path)
        return checkpoint

    def resolve_weights_only(self, weights_only: bool | None) -> bool:
        """Whether a load reads files without running code from them: ``weights_only``, else the CheckpointIO's setting."""
        return self.checkpoint_io.weights_only if weights_only is None else bool(weights_only)

    def load_into(
        self, checkpoint: Mapping[str, Any], state: Mapping[str, Any], strict: bool = True, path: Any = None
    ) -> None:
        """Load the entries of ``checkpoint`` into the modules and optimizers found under the same keys in ``state``."""
        for key, target, kind, saved in stateful_entries(checkpoint, state, path):
            if kind == MODULE:
                self.load_module_state_dict(target, saved, strict=strict)
            else:
                for opt, opt_state in paired_optimizer_states(key, target, saved, path):
                    self.load_optimizer_state_dict(opt, opt_state)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        """Delete a checkpoint through the CheckpointIO (rank 0 only)."""
        if self.is_global_zero:
            self.checkpoint_io.remove_checkpoint(path)

    # --------------------------------------------------------------- teardown
    def teardown(self) -> None:
        """Release what the run took: the precision's state, pending checkpoint writes, device caches."""
        self.precision.teardown()
        if self._checkpoint_io is not None:
            self._checkpoint_io.teardown()
        if self.accelerator is not None:
            self.accelerator.teardown()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(accelerator={self.accelerator!r}, precision={self._precision!r})"


def _no_wait() -> None:
    return None


def _precision_alias(precision: Precision | None, precision_plugin: Precision | None) -> Precision | None:
    """``precision_plugin=`` is Lightning's name for ``precision=``; one of them may be given, not both."""
    if precision_plugin is None:
        return precision
    if precision is not None:
        raise ConfigurationError(
            f"Both precision={precision!r} and precision_plugin={precision_plugin!r} were given. precision_plugin is "
            "Lightning's name for precision: give one of them."
        )
    return precision_plugin
