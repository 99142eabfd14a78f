"""DDPStrategy: one process per device, the module wrapped in torch.nn.parallel.DistributedDataParallel.

The processes are started by a launcher chosen from ``start_method``: ``"popen"`` re-runs the
script for local ranks 1..N-1 (strategy ``ddp``), ``"spawn"``/``"fork"``/``"forkserver"`` run the
function in N new processes (``ddp_spawn``, ``ddp_fork``/``ddp_notebook``). Under torchrun, srun
or mpirun the processes already exist and nothing is started.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from torchfleet import watchdog
from torchfleet.errors import ConfigurationError
from torchfleet.launchers.base import check_max_restarts, check_restarts_apply
from torchfleet.strategies.ddp_buckets import fix_bucket_layout
from torchfleet.strategies.parallel import ParallelStrategy

if TYPE_CHECKING:
    from torchfleet.accelerators.base import Accelerator
    from torchfleet.checkpoint.io import CheckpointIO
    from torchfleet.environments.base import ClusterEnvironment
    from torchfleet.precision import Precision

log = logging.getLogger(__name__)

START_METHODS = ("popen", "spawn", "fork", "forkserver")
#: torch's own default for process groups (30 minutes)
DEFAULT_TIMEOUT = timedelta(minutes=30)
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

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | float | None = DEFAULT_TIMEOUT,
        start_method: str = "popen",
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable | None = None,
        precision_plugin: Precision | None = None,
        max_restarts: int = 0,
        **ddp_kwargs: Any,
    ) -> None:
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         precision=precision, process_group_backend=process_group_backend,
                         precision_plugin=precision_plugin)
        if start_method not in START_METHODS:
            raise ConfigurationError(
                f"start_method={start_method!r} is not understood. Accepted: 'popen' (re-run the script for each "
                "rank; strategy='ddp'), 'spawn' ('ddp_spawn'), 'fork' ('ddp_fork', 'ddp_notebook') and "
                "'forkserver'."
            )
        if timeout is not None and not isinstance(timeout, timedelta):
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
                raise ConfigurationError(
                    f"timeout={timeout!r} is not valid: give a datetime.timedelta or a number of seconds > 0."
                )
            timeout = timedelta(seconds=timeout)
        if ddp_comm_state is not None and ddp_comm_hook is None:
            raise ConfigurationError(
                "ddp_comm_state was given without ddp_comm_hook: the state is only passed to a hook. Give "
                "ddp_comm_hook too (for example torch.distributed.algorithms.ddp_comm_hooks.default_hooks."
                "fp16_compress_hook), or drop ddp_comm_state."
            )
        self.timeout = timeout
        self.start_method = start_method
        self._max_restarts = check_max_restarts(max_restarts)
        self._ddp_comm_state = ddp_comm_state
        self._ddp_comm_hook = ddp_comm_hook
        self._ddp_kwargs = ddp_kwargs
        _check_ddp_kwargs(ddp_kwargs)
        #: sync_batchnorm converted the Module's BatchNorm layers in this fit: teardown converts them back
        self._layers_synced = False

    # ----------------------------------------------------------------- configuration
    def configure(self, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment) -> None:
        super().configure(devices, num_nodes, cluster_environment)
        env = self.cluster_environment
        assert env is not None and self.parallel_devices is not None
        # the pre-flight check (a launch that disagrees with devices x num_nodes) runs where Lightning runs it: in
        # launcher.launch, before any process starts or waits in init_process_group for ranks that never come
        self.set_world_ranks()
        if self.start_method == "popen":
            from torchfleet.launchers.script import ScriptLauncher

            self._launcher = ScriptLauncher(env, self.num_processes, num_nodes)
        else:
            from torchfleet.launchers.processes import ProcessLauncher

            self._launcher = ProcessLauncher(env, self.num_processes, num_nodes, self.start_method)
        self._apply_max_restarts()
        if self.num_processes * num_nodes == 1:
            self._warn_single_process()

    @property
    def max_restarts(self) -> int:
        """How many times every rank is started again after one fails (resuming from the newest checkpoint)."""
        return self._max_restarts

    @max_restarts.setter
    def max_restarts(self, value: int) -> None:
        self._max_restarts = check_max_restarts(value)
        self._apply_max_restarts()

    def _apply_max_restarts(self) -> None:
        launcher = self._launcher
        if launcher is None:  # not configured yet: configure() applies it
            return
        launcher.max_restarts = self._max_restarts
        check_restarts_apply(self._max_restarts, self.cluster_environment, self.num_processes, self.num_nodes)

    def _warn_single_process(self) -> None:
        log.warning(
            "strategy='ddp' with a single process: it runs, but there is nothing to synchronise with; "
            "strategy='single_device' does the same without the process group."
        )

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
        """Record this process's ranks (``set_world_ranks``) and join the process group, once per process.

        A process already in a group of this world size (an earlier Trainer or Fleet in the script) keeps it.
        """
        import torch.distributed as dist

        self.set_world_ranks()

        if dist.is_initialized():
            have = dist.get_world_size()
            if have != self.world_size:
                raise ConfigurationError(
                    f"This process already belongs to a process group of {have} processes, but this run asks for "
                    f"{self.world_size}. One script trains with one world size: give every Trainer/Fleet the same "
                    "devices and num_nodes, or call torch.distributed.destroy_process_group() between them."
                )
            self._start_watchdog(None)
            return
        env = self.cluster_environment
        assert env is not None
        # env:// rendezvous with explicit ranks; torchrun's agent store is used when torchrun provides one
        os.environ.setdefault("MASTER_ADDR", env.main_address)
        os.environ.setdefault("MASTER_PORT", str(env.main_port))
        if self.process_group_backend == "gloo":
            _warn_if_gloo_would_advertise_loopback(os.environ["MASTER_ADDR"])
        kwargs: dict[str, Any] = {}
        if self.timeout is not None:
            kwargs["timeout"] = self.timeout
        if self.root_device.type == "cuda":
            kwargs["device_id"] = self.root_device
        log.debug("init_process_group(%s) rank %d of %d at %s:%s", self.process_group_backend, self.global_rank,
                  self.world_size, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
        nccl_prefix = None
        if self.process_group_backend == "nccl" and self.hang_timeout is not None:
            from torchfleet.launchers.supervise import rank_error_dir

            nccl_prefix = watchdog.nccl_flight_recorder_env(run_dir=rank_error_dir())
        store = self._loopback_store()
        if store is not None:
            kwargs["store"] = store
        dist.init_process_group(self.process_group_backend, world_size=self.world_size, rank=self.global_rank,
                                **kwargs)
        atexit.register(_destroy_process_group)
        self._start_watchdog(nccl_prefix)

    def _loopback_store(self) -> Any:
        """The rendezvous store of a one-machine run our launchers started, listening on 127.0.0.1 only; else None.

        torch's env:// store listens on every interface (``*:MASTER_PORT``) though every rank is on this machine.
        Across machines, or where torchrun/srun/mpirun started the ranks (their store, their address), env://.
        """
        from torchfleet.environments.local import LocalEnvironment

        # LocalEnvironment: our launchers (or a hand start) on this machine; the others' launchers own the rendezvous
        if self.num_nodes != 1 or not isinstance(self.cluster_environment, LocalEnvironment):
            return None
        import socket

        from torch.distributed import TCPStore

        port = int(os.environ["MASTER_PORT"])
        timeout = self.timeout if self.timeout is not None else DEFAULT_TIMEOUT
        if self.global_rank != 0:
            return TCPStore("127.0.0.1", port, self.world_size, False, timeout)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's: a restart's port may linger
        try:
            listener.bind(("127.0.0.1", port))
            listener.listen(max(128, self.world_size))
        except OSError as exc:
            listener.close()
            raise ConfigurationError(
                f"Rank 0 cannot listen on 127.0.0.1:{port} (MASTER_PORT) for the other ranks: {exc.strerror}. Unset "
                "MASTER_PORT to let torchfleet pick a free port, or export one that is free."
            ) from None
        # the store takes the socket over (detach: Python must not close it under the store)
        return TCPStore("127.0.0.1", port, self.world_size, True, timeout, master_listen_fd=listener.detach())

    def _start_watchdog(self, nccl_prefix: str | None) -> None:
        """Open this rank's collectives record and start its hang watchdog (watchdog.py), once per process."""
        if self.world_size == 1:
            return
        from torch.distributed import distributed_c10d

        from torchfleet.launchers.supervise import rank_error_dir

        try:
            store = distributed_c10d._get_default_store()
        except Exception:  # noqa: BLE001 - torchrun's agent store may not be reachable this way
            store = None
        watchdog.start(self.global_rank, self.world_size, self.hang_timeout, rank_error_dir(), store, nccl_prefix)

    # ----------------------------------------------------------------- the module
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Wrap ``module`` through ``configure_ddp`` and return the wrapped module (Fleet's, and fit's).

        ``self.model`` is ``module`` when ``configure_ddp`` runs, as in Lightning; ``training_step`` then runs
        inside the forward of whatever wrapper it builds (``redirect_through``). Fleet's modules leave
        ``self.model`` as it was (the Trainer's is the wrapper from then on).
        """
        if self.training_settings.sync_batchnorm:
            from torchfleet.strategies.sync_batchnorm import convert_sync_batchnorm

            converted = convert_sync_batchnorm(module, self.root_device)
            self._layers_synced = self._layers_synced or module is self.lightning_module
            module = converted
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

    def teardown(self) -> None:
        """Unwrap the Module (``model`` is the Module again), revert SyncBatchNorm layers, then the parts' teardown."""
        module = self.lightning_module
        if module is not None and self.model is not module:
            self.model = module
        if self._layers_synced and module is not None:
            from torchfleet.strategies.sync_batchnorm import revert_sync_batchnorm

            revert_sync_batchnorm(module)
            self._layers_synced = False
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


def _is_loopback(address: str) -> bool:
    import ipaddress
    import socket

    try:
        return ipaddress.ip_address(socket.gethostbyname(address)).is_loopback
    except (OSError, ValueError):
        return False


def _warn_if_gloo_would_advertise_loopback(main_address: str) -> None:
    """Across machines, gloo tells the others to reach this rank at the address its hostname resolves to.

    Many hosts map their own name to 127.0.0.1 in /etc/hosts; the other machines then connect to
    themselves and the run waits until the timeout. GLOO_SOCKET_IFNAME picks the interface instead.
    """
    import socket

    if os.environ.get("GLOO_SOCKET_IFNAME") or _is_loopback(main_address):
        return
    if _is_loopback(socket.gethostname()):
        log.warning(
            "MASTER_ADDR=%s is another machine, but this machine's name (%s) resolves to a loopback address, "
            "which gloo would give the other ranks to reach this one: they cannot, and the run would wait until "
            "the timeout. Set GLOO_SOCKET_IFNAME to the network interface the machines share (e.g. eth0), or fix "
            "the name's entry in /etc/hosts.", main_address, socket.gethostname(),
        )


_EXIT_GRACE_S = 0.1


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # A gloo worker thread drops the last collective's tensors a moment after the caller's wait() returns, and
        # dropping them takes the GIL; if the interpreter is already finalising by then, the process aborts
        # ("terminate called without an active exception", SIGABRT). destroy_process_group() does not join those
        # threads, so give them a moment, with the GIL released, while the interpreter is still whole.
        time.sleep(_EXIT_GRACE_S)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


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
