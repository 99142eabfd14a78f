"""Strategy: one Accelerator, one Precision, one CheckpointIO (and, for parallel ones, a ClusterEnvironment).

The Trainer and Fleet drive training only through the methods here; anything that differs between
single-device, data-parallel and sharded training is a method that a subclass overrides. The Trainer's
contract is Lightning's (trainer_contract.py, the base class); Fleet's is Fabric's, under names that do not
collide with it: ``setup_module_and_optimizers``, ``run_backward`` (Fabric's ``backward(tensor, module)``),
``save_state`` / ``load_state`` (Fabric's ``save_checkpoint(path, state)`` / ``load_checkpoint(path, state)``).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.checkpoint.io import TorchCheckpointIO
from torchfleet.errors import ConfigurationError
from torchfleet.settings import TrainingSettings
from torchfleet.strategies.arguments import PARTS, takes
from torchfleet.strategies.checkpoint_methods import CheckpointMethods
from torchfleet.strategies.memory_model import MemoryModel
from torchfleet.strategies.trainer_contract import TrainerContract
from torchfleet.strategies.utils import (
    ReduceOp,
    _check_op,
    apply_to_tensors,
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


def settable(name: str, doc: str) -> property:
    """A property reading and writing the attribute ``name`` (subclasses may override it with their own)."""
    return property(lambda self: getattr(self, name), lambda self, value: setattr(self, name, value), doc=doc)


def constant(value: Any, doc: str) -> property:
    """A read-only property that is ``value`` here (subclasses with processes override it)."""
    return property(lambda self: value, doc=doc)


class Strategy(TrainerContract, CheckpointMethods, ABC):
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
    #: seconds a rank may wait in one collective before the watchdog stops the run (None: no watchdog): the Trainer's or
    #: Fleet's ``hang_timeout``, given by ``connector.resolve``; only strategies that run collectives read it
    hang_timeout: float | None = None
    #: who started the processes and where rank 0 listens (ParallelStrategy's; None for a one-process strategy)
    cluster_environment: Any = None
    #: whether the ranks agree on a preemption signal over torch.distributed (trainer/preemption.py); False where the
    #: ranks share no process group (XLA's replicas): each then stops on its own signal
    agrees_on_signals: bool = True
    #: the DeviceMesh a Module parallelises itself over in ``configure_model`` (``Module.device_mesh``); None but
    #: under a strategy that builds one (ModelParallelStrategy)
    module_device_mesh: Any = None
    #: this rank's pipeline stages, one module each, when a schedule runs several per rank (``Module.pipeline_stages``)
    pipeline_stages: Any = None

    @classmethod
    def unusable_here(cls, cuda: bool) -> str | None:
        """Why this strategy cannot run on this machine (``cuda``: CUDA devices can be used), None when it can.

        ``torchfleet strategies`` shows it, and a misspelt strategy name is not pointed at a strategy that has one.
        """
        return None

    @takes(*PARTS)
    def __init__(self, given: dict[str, Any]) -> None:
        from torchfleet.precision import Precision as _FullPrecision

        precision = _precision_alias(given["precision"], given["precision_plugin"])
        self._explicit = {k for k, v in given.items() if k != "precision_plugin" and v is not None}
        if precision is not None:
            self._explicit.add("precision")
        self._accelerator: Accelerator | None = given["accelerator"]
        # never None, so the per-step methods below read it without a check
        self._precision: Precision = precision if precision is not None else _FullPrecision()
        self._checkpoint_io: CheckpointIO | None = given["checkpoint_io"]
        self._launcher: Launcher | None = None

    # ------------------------------------------------------------------ parts
    accelerator = settable("_accelerator", "The Accelerator (None until resolved).")
    precision = settable("_precision", "The Precision.")
    precision_plugin = settable("_precision", "Lightning's name for :attr:`precision` (the same object).")

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

    world_size = constant(1, "How many processes the run has.")
    global_rank = constant(0, "This process's rank among all.")
    local_rank = constant(0, "This process's rank on its node.")
    node_rank = constant(0, "This process's node.")
    num_nodes = constant(1, "How many machines the run has.")
    num_processes = constant(1, "Processes per node.")

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

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: Sequence[Optimizer] = (), scheduler: Any = None
    ) -> tuple[nn.Module, list[Optimizer], Any]:
        """Convert, place and wrap ``module``; prepare ``optimizers`` (Fabric's name; Fleet's ``setup``).

        Returns ``(module, optimizers, scheduler)``: the objects to train with (``scheduler`` unchanged here).
        """
        module = self.precision.convert_module(module)
        module = self.module_to_device(module)
        module = self.setup_module(module)
        return module, [self.setup_optimizer(o) for o in optimizers], scheduler

    def module_to_device(self, module: nn.Module) -> nn.Module:
        """Place ``module`` on ``root_device`` (in place; returns it)."""
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
        """Set up ``module`` and the optimizers ``build()`` creates over its parameters (``setup(trainer)`` in fit).

        Default: build them first, then set both up. Strategies whose wrapping replaces the parameters
        (fsdp) set the module up first, so the optimizers hold the parameters that are trained.
        """
        module, optimizers, _ = self.setup_module_and_optimizers(module, build())
        return module, optimizers

    def setup_for_evaluation(self, module: nn.Module) -> nn.Module:
        """Set ``module`` up for validate/test/predict (``setup(trainer)`` outside fit): as for training, without optimizers."""
        return self.setup_module_and_optimizers(module, [])[0]

    @contextlib.contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        """Where tensors are created: on ``root_device``, in the precision's parameter dtype.

        ``empty_init`` is for sharded strategies (parameters on the meta device, materialised sharded in
        setup); strategies that hold the whole model ignore it.
        """
        with torch.device(self.root_device), self.precision.tensor_init_context():  # a precision's override counts
            yield

    def module_init_context(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager:
        """Where ``init_module`` creates a model (Fabric's name): ``tensor_init_context(empty_init)``."""
        return self.tensor_init_context(empty_init)

    def unshard_module(self, module: nn.Module) -> None:
        """Make the user's module inside ``module`` an ordinary one again: whole weights, none of the strategy's hooks.

        User code can then call it, and any submodule, on any rank alone and gets what the unsharded
        model gives. Sharded strategies gather here, so every rank calls it; here every rank already
        holds the whole model, so there is nothing to do.
        """

    def on_exception(self, exception: BaseException) -> None:
        """A stage raised ``exception`` (called before ``teardown``): the ranks may now be anywhere.

        Sharded strategies then leave the module as it is at teardown, since making it whole would need
        every rank.
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

    #: Whether ``step_function(module, "training_step")`` runs the backward itself and returns the batch's loss,
    #: detached (pipeline schedules): the Trainer then neither backpropagates it nor calls the backward hooks
    step_backpropagates: bool = False

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

    def process_dataloader(self, dataloader: Any) -> Any:
        """Adapt a dataloader, after the client gave it this rank's sampler (``distributed_sampler_kwargs``). Default: as is."""
        return dataloader

    #: a strategy whose every forward is a collective (fsdp, ZeRO-3) names itself here: evaluation loaders then give
    #: every rank the same number of batches (``samplers.pad_evaluation_shards``); None: exact shards
    even_evaluation_shards: str | None = None

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Move tensors inside ``batch`` to ``device`` (default: ``root_device``) and apply precision.

        The Trainer runs the Module's transfer hooks around this (its ``transfer_batch_to_device`` replaces it).
        """
        return self._precision.convert_input(move_to_device(batch, device or self.root_device))

    # --------------------------------------------------------------- training
    def forward_context(self) -> contextlib.AbstractContextManager:
        """Context wrapping forward passes (autocast under mixed precision)."""
        return self._precision.forward_context()

    def run_backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        """Compute gradients of ``tensor`` through ``module`` (the precision's scaler, the wrapper's synchronisation).

        Fabric's ``backward(tensor, module)``: Fleet calls it, and the Trainer's ``backward`` runs it. The precision
        gets Lightning's arguments: the Module (not its wrapper) under a Trainer, and the optimizer that steps next.
        """
        owner = self._lightning_module
        self._precision.backward(tensor, module if owner is None else owner, self._stepping, *args, **kwargs)

    #: the optimizer the Trainer's ``backward`` backpropagates for (Lightning's argument to ``Precision.backward``)
    _stepping: Optimizer | None = None

    def optimizer_step(
        self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, model: nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        """Step ``optimizer``; ``closure`` (training_step and backward, from the Trainer) runs inside the step.

        Returns what the optimizer's step returns (torch's: the closure's loss). ``model`` is Lightning's argument
        (the Module; the Trainer passes none, and the precision then gets the Module). Fleet calls it without a closure, after its own backward.
        """
        owner = self._lightning_module if model is None else model
        return self._precision.optimizer_step(optimizer, model=owner, closure=closure, **kwargs)

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

        The norm is a plain tensor also where the gradients are sharded DTensors (fsdp). Under a loss scaler
        (16-mixed) an inf/nan norm is never an error: the scaler skips that step
        and lowers the scale, so ``error_if_nonfinite`` applies only to precisions without one.
        """
        if optimizer is not None:
            self.precision.unscale_gradients(optimizer)
        if error_if_nonfinite and self.precision.skips_nonfinite_steps:
            error_if_nonfinite = False
        params = self._gradient_params(module, optimizer)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type, error_if_nonfinite=error_if_nonfinite)
        full = getattr(norm, "full_tensor", None)  # sharded gradients (DTensors): the norm over all ranks, whole
        return full() if callable(full) else norm

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
    # What a collective is for (hang and desync reports) is said with ``watchdog.labelled``, never an argument:
    # subclasses keep Lightning's signatures.
    def reduce(self, tensor: Tensor | Any, group: Any | None = None, reduce_op: Any = "mean") -> Tensor | Any:
        """Reduce ``tensor`` across the processes of ``group`` (None: all) with ``reduce_op``. One process: unchanged.

        ``reduce_op``: "mean" (or "avg"), "sum", "max", "min", or a ``torch.distributed.ReduceOp``.
        """
        _check_op(reduce_op)
        return tensor

    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        """Stack ``tensor`` from every process along a new first dimension. One process: ``tensor[None]``."""
        return tensor.unsqueeze(0) if isinstance(tensor, Tensor) else tensor

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Return rank ``src``'s ``obj`` on every process. One process: ``obj``."""
        return obj

    def all_gather_object(self, obj: Any, name: str | None = None) -> list[Any]:
        """Every process's picklable ``obj``, in rank order. One process: ``[obj]``."""
        return [obj]

    # the user-facing forms (Module, Trainer, Fleet): nested collections of tensors or numbers
    # ``group``: every rank (None), a ProcessGroup, a 1-D DeviceMesh or a dimension name of ``module_device_mesh``;
    # passed on only when given (a subclass may override all_gather(tensor, sync_grads) without it)
    def all_gather_tree(self, data: Any, sync_grads: bool = False, name: str | None = None, group: Any = None) -> Any:
        """``all_gather`` every tensor inside ``data`` (nested dicts, lists, tuples) over ``group``."""
        over = {} if group is None else {"group": group}
        with labelled(name):  # by label, not argument: subclasses may override all_gather(tensor, sync_grads)
            return apply_to_tensors(data, lambda t: self.all_gather(t, sync_grads=sync_grads, **over))

    def all_reduce_tree(self, data: Any, op: ReduceOp = "mean", name: str | None = None, group: Any = None) -> Any:
        """``reduce`` every tensor or number inside ``data`` (nested dicts, lists, tuples) with ``op`` over ``group``."""
        _check_op(op)
        over = {} if group is None else {"group": group}
        with labelled(name):
            return apply_to_tensors(data, lambda t: self.reduce(t, reduce_op=op, **over))

    def barrier(self, name: str | None = None) -> None:
        """Wait until every process reaches this point. One process: returns at once."""

    @contextlib.contextmanager
    def unbounded_barrier(self) -> Iterator[Callable[[], None]]:
        """A barrier without the collectives' timeout, for waits of unknown length (rank 0 downloading a data set).

        Every process enters the block; inside, calling the yielded function waits until every process
        has called it. One process: it returns at once.
        """
        yield _no_wait

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Agree on a flag across processes: True if ``all`` (or, with all=False, any) of them said True."""
        return bool(decision)

    # --------------------------------------------------------------- planning
    #: the Module's ``configure_model`` parallelises it over this strategy's mesh (ModelParallelStrategy): the
    #: planner leaves it to ``memory_model``, which knows the mesh, instead of running it on the traced copy
    configure_model_parallelizes = False

    def memory_model(self, module: nn.Module, world_size: int, num_nodes: int) -> MemoryModel:
        """How this strategy would place ``module``'s bytes on ``world_size`` ranks (read by estimate_memory)."""
        return MemoryModel()

    # --------------------------------------------------------------- teardown
    def teardown(self) -> None:
        """Release what the run took; the Trainer calls it last in every stage (after ``on_exception`` on an error).

        The Trainer's Module goes back to the CPU with its optimizers' state (so it can be called with CPU
        tensors after a stage on a GPU, and the device's memory is given back), then the precision's state,
        pending checkpoint writes and device caches are released. Subclasses release what they took first.
        """
        module = self.lightning_module
        if module is not None and self.root_device.type != "cpu":
            cpu = torch.device("cpu")
            for optimizer in self.optimizers:
                for state in optimizer.state.values():
                    for key, value in state.items():
                        if isinstance(value, Tensor):
                            state[key] = value.to(cpu)
            module.cpu()
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
