"""DDPStrategy: one process per device, the module wrapped in torch.nn.parallel.DistributedDataParallel.

The processes are started by the launcher ParallelStrategy chooses from ``start_method`` (processes.py):
``"popen"`` re-runs the script for local ranks 1..N-1 (strategy ``ddp``), ``"spawn"``/``"fork"``/``"forkserver"``
run the function in N new processes (``ddp_spawn``, ``ddp_fork``/``ddp_notebook``). Under torchrun, srun or
mpirun the processes already exist and nothing is started.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from torchfleet import watchdog
from torchfleet.errors import ConfigurationError
from torchfleet.strategies.arguments import PARALLEL, pick, takes
from torchfleet.strategies.ddp_buckets import fix_bucket_layout
from torchfleet.strategies.memory_model import MemoryModel
from torchfleet.strategies.parallel import ParallelStrategy
from torchfleet.strategies.processes import ProcessOptions

if TYPE_CHECKING:
    from torchfleet.environments.base import ClusterEnvironment

log = logging.getLogger(__name__)

_HOOK_KWARG = "_torchfleet_hook"


class _HookDispatch(nn.Module):
    """Lets an engine's forward run any hook of the user's module: ``engine(batch, _torchfleet_hook="training_step")``.

    DeepSpeed's engine wraps this (it prepares its gradient work and ZeRO-3's parameter fetches in its forward);
    without the keyword the call is the module's ordinary forward. DDP wraps the user's module itself
    (Lightning's ``configure_ddp`` sees the Module) and gets there by ``redirect_through``.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        hook = kwargs.pop(_HOOK_KWARG, None)
        if hook is None:
            return self.module(*args, **kwargs)
        return getattr(self.module, hook)(*args, **kwargs)


_MISSING = object()


def redirect_through(wrapper: nn.Module, module: nn.Module, name: str) -> Callable[..., Any]:
    """A callable that runs ``module.<name>`` inside ``wrapper``'s forward (Lightning's forward redirection).

    DDP prepares gradient synchronisation only in its own forward, which calls ``module.forward``: for one call,
    that is ``module.<name>`` instead (an instance attribute, removed again as soon as it runs, so forwards inside
    the step are the module's own).
    """
    method = getattr(module, name)
    attributes = module.__dict__

    def inner(*args: Any, **kwargs: Any) -> Any:
        restore()
        return method(*args, **kwargs)

    previous: list[Any] = [_MISSING]

    def restore() -> None:
        if previous[0] is _MISSING:
            attributes.pop("forward", None)
        else:
            attributes["forward"] = previous[0]

    def call(*args: Any, **kwargs: Any) -> Any:
        previous[0] = attributes.get("forward", _MISSING)  # torch.compile'd in place: a forward of its own
        attributes["forward"] = inner
        try:
            return wrapper(*args, **kwargs)
        finally:
            restore()

    return call


class DDPStrategy(ParallelStrategy):
    """Data-parallel training with DistributedDataParallel, one process per device, on one or more machines.

    ``process_group_backend``: default nccl on CUDA, gloo on CPU; any value given is used as is.
    ``timeout``: how long a collective may wait (a timedelta or seconds). ``start_method``: "popen"
    (default), "spawn", "fork" or "forkserver". ``ddp_comm_hook``/``ddp_comm_state``: a DDP
    communication hook and its state (e.g. ``torch.distributed.algorithms.ddp_comm_hooks``).
    ``precision_plugin``: Lightning's name for ``precision`` (give one of the two). ``max_restarts``: when a
    rank fails, every rank is stopped and started again (resuming from the newest checkpoint), up to this
    many times (default 0: the run fails at once); also ``Trainer(max_restarts=)``.
    Every other keyword (``static_graph``, ``find_unused_parameters``, ``gradient_as_bucket_view``,
    ``bucket_cap_mb``, ``broadcast_buffers``, ...) goes to DistributedDataParallel.
    """

    reseeds_for = frozenset({"trainer"})  # Lightning's DDPStrategy re-seeds; Fabric's does not

    @takes("accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision",
           "process_group_backend", "timeout", "start_method", "ddp_comm_state", "ddp_comm_hook", "precision_plugin",
           "max_restarts")
    def __init__(self, given: dict[str, Any], ddp_comm_state: object | None = None, ddp_comm_hook: Callable | None = None,
                 **ddp_kwargs: Any) -> None:
        super().__init__(**pick(given, PARALLEL))
        self.processes = ProcessOptions.of(given)
        if ddp_comm_state is not None and ddp_comm_hook is None:
            raise ConfigurationError(
                "ddp_comm_state was given without ddp_comm_hook: the state is only passed to a hook. Give "
                "ddp_comm_hook too (for example torch.distributed.algorithms.ddp_comm_hooks.default_hooks."
                "fp16_compress_hook), or drop ddp_comm_state."
            )
        self._ddp_comm_state = ddp_comm_state
        self._ddp_comm_hook = ddp_comm_hook
        self._ddp_kwargs = ddp_kwargs
        _check_ddp_kwargs(ddp_kwargs)

    # ----------------------------------------------------------------- configuration
    def configure(self, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment) -> None:
        super().configure(devices, num_nodes, cluster_environment)
        if self.num_processes * num_nodes == 1:
            log.warning(
                "strategy='ddp' with a single process: it runs, but there is nothing to synchronise with; "
                "strategy='single_device' does the same without the process group."
            )

    # ----------------------------------------------------------------- the module
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Wrap ``module`` through ``configure_ddp`` and return the wrapped module (Fleet's, and fit's).

        ``self.model`` is ``module`` when ``configure_ddp`` runs, as in Lightning; ``training_step`` then runs
        inside the forward of whatever wrapper it builds (``redirect_through``). Fleet's modules leave
        ``self.model`` as it was (the Trainer's is the wrapper from then on).
        """
        module = self.sync_batchnorm(module)
        trainer_module = self._model
        self._model = module  # silently (no property event): configure_ddp reads it
        self.configure_ddp()
        wrapped = self.model
        if module is not self.lightning_module or module is wrapped:
            self._model = trainer_module
        assert wrapped is not None
        return wrapped

    def setup_and_build_optimizers(
        self, module: nn.Module, build: Callable[[], list[Any]]
    ) -> tuple[nn.Module, list[Any]]:
        """Wrap first (``configure_ddp``), then build the optimizers: Lightning's order, and fsdp's need (its
        optimizers must hold the sharded parameters, and only 1/N of the state)."""
        wrapped, _, _ = self.setup_module_and_optimizers(module, [])
        return wrapped, [self.setup_optimizer(o) for o in build()]

    def setup_for_evaluation(self, module: nn.Module) -> nn.Module:
        """Outside fit there are no gradients to reduce: no DDP wrapper (Lightning's ``configure_ddp`` is fit only).

        The module is converted and placed, and every rank takes rank 0's parameters and buffers, as DDP's
        constructor would have given them.
        """
        module = self.module_to_device(self.precision.convert_module(module))
        if self.world_size > 1 and self.distributed_ready:
            import torch.distributed as dist
            from torch.distributed.utils import _sync_module_states

            with watchdog.collective("broadcast(module states from rank 0)"):
                _sync_module_states(module, dist.group.WORLD, 250 * 1024 * 1024, 0, set(), broadcast_buffers=True)
        return module

    def configure_ddp(self) -> None:
        """Replace ``self.model`` (the Module) by its DistributedDataParallel wrapper (Lightning's hook of this name).

        Override to use your own DDP: ``self.model = MyDDP(self.model, device_ids=self.determine_ddp_device_ids())``.
        The default fixes DDP's gradient bucket layout before the first step (``ddp_buckets.fix_bucket_layout``: a
        resumed run then reduces bitwise as the uninterrupted one on any number of ranks) and registers
        ``ddp_comm_hook`` when one was given.
        """
        from torch.nn.parallel import DistributedDataParallel

        assert self.model is not None
        kwargs = self._ddp_kwargs
        if self.training_settings.manual_optimization and not {"find_unused_parameters", "static_graph"} & set(kwargs):
            # manual optimisation: each backward may reach only part of the model (a GAN's generator loss with the
            # discriminator toggled off); DDP must then find the parameters a backward does not reach
            kwargs = {**kwargs, "find_unused_parameters": True}
        self.model = DistributedDataParallel(self.model, device_ids=self.determine_ddp_device_ids(), **kwargs)
        fix_bucket_layout(self.model)  # before the comm hook, which would see its all-reduce
        if self._ddp_comm_hook is not None:
            self.model.register_comm_hook(self._ddp_comm_state, self._ddp_comm_hook)

    def run_backward(self, tensor: torch.Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        """Under manual optimisation, re-arm DDP's gradient all-reduce for this backward first.

        DDP's forward prepares the all-reduce of one backward; a training_step that calls manual_backward
        twice (generator, then discriminator) needs it prepared again for each, on the loss at hand.
        """
        if self.training_settings.manual_optimization:
            _prepare_reducer(module, tensor)
        super().run_backward(tensor, module, *args, **kwargs)

    def determine_ddp_device_ids(self) -> list[int] | None:
        """``device_ids`` for DistributedDataParallel: this rank's GPU, or None on the CPU."""
        return [self.root_device.index] if self.root_device.type == "cuda" else None

    def unwrap(self, module: nn.Module) -> nn.Module:
        """The user's module inside DDP (a subclass of DistributedDataParallel of yours too)."""
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(module, DistributedDataParallel):
            module = module.module
        return module.module if isinstance(module, _HookDispatch) else module

    def step_function(self, module: nn.Module, name: str) -> Callable[..., Any]:
        """training_step runs inside the wrapper's forward (which sets up the gradient all-reduce); the others plain.

        Evaluation steps skip DDP's forward on purpose: it may broadcast buffers, a collective per
        batch, and ranks with uneven evaluation shards would then wait for each other forever.
        """
        user = self.unwrap(module)
        if name == "training_step" and module is not user:
            return redirect_through(module, user, name)
        return getattr(user, name)

    #: DDP synchronises only the gradients of computations that ran inside its forward
    outside_forward = "without_grad"

    def forward_method(self, module: nn.Module, name: str) -> Callable[..., Any]:
        """``name`` run inside DDP's forward (``redirect_through``), as ``training_step`` is."""
        user = self.unwrap(module)
        if module is user:
            return getattr(module, name)
        return redirect_through(module, user, name)

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """Skip DDP's gradient all-reduce for forward+backward passes inside the block (gradient accumulation)."""
        from torch.nn.parallel import DistributedDataParallel

        if enabled and isinstance(module, DistributedDataParallel):
            with module.no_sync():
                yield
        else:
            yield

    def on_exception(self, exception: BaseException) -> None:
        """An error of DDP's reducer about parameters without gradients says how to let DDP find them (as Lightning)."""
        if "Expected to have finished reduction in the prior iteration" in str(exception) and exception.args:
            exception.args = (f"{exception.args[0]}\n{_UNUSED_PARAMETERS_HINT}", *exception.args[1:])

    def memory_model(self, module: nn.Module, world_size: int, num_nodes: int) -> MemoryModel:
        # every rank holds everything; the reducer's buckets are a second copy of the gradients unless they are views
        return MemoryModel(gradient_bucket_copy=not self._ddp_kwargs.get("gradient_as_bucket_view", False))

    def teardown(self) -> None:
        """Unwrap the Module (``model`` is the Module again), then ParallelStrategy's teardown."""
        module = self.lightning_module
        if module is not None and self.model is not module:
            self.model = module
        super().teardown()

    def __repr__(self) -> str:
        return (f"DDPStrategy(start_method={self.start_method!r}, devices={self.num_processes}, "
                f"num_nodes={self.num_nodes}, precision={self.precision!r})")


_UNUSED_PARAMETERS_HINT = (
    "It looks like your Module has parameters that were not used in producing the loss returned by training_step. If "
    "this is intentional, let DDP find them: strategy='ddp_find_unused_parameters_true', or "
    "DDPStrategy(find_unused_parameters=True)."
)


def _prepare_reducer(module: nn.Module | None, loss: torch.Tensor) -> None:
    """Make DDP's reducer expect the backward of ``loss`` (it searches ``loss``'s graph for unused parameters)."""
    from torch.nn.parallel import DistributedDataParallel

    if not (isinstance(module, DistributedDataParallel) and torch.is_grad_enabled()
            and module.require_backward_grad_sync):
        return  # not DDP, or inside no_backward_sync: this backward only accumulates
    search = module.find_unused_parameters and not module.static_graph
    module.require_forward_param_sync = True
    module.reducer._rebuild_buckets()
    module.reducer.prepare_for_backward([loss] if search else [])


def _check_ddp_kwargs(kwargs: dict[str, Any]) -> None:
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    accepted = set(inspect.signature(DistributedDataParallel.__init__).parameters) - {"self", "module", "device_ids"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        from torchfleet.errors import closest

        hints = [f"{u!r} (did you mean {closest(u, accepted)[0]!r}?)" if closest(u, accepted) else repr(u)
                 for u in unknown]
        raise ConfigurationError(
            f"DDPStrategy got keyword(s) {', '.join(hints)} that neither it nor DistributedDataParallel accepts. "
            f"DDPStrategy takes process_group_backend, timeout, start_method, ddp_comm_hook and ddp_comm_state; "
            f"DistributedDataParallel takes {', '.join(sorted(accepted))}."
        )
