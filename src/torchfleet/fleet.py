"""Fleet: your own training loop over the same strategies the Trainer uses.

    fleet = Fleet(devices=1, precision="bf16-mixed")
    model, optimizer = fleet.setup(model, optimizer)
    loader = fleet.setup_dataloaders(loader)
    for x, y in loader:
        optimizer.zero_grad()
        fleet.backward(loss_fn(model(x), y))
        optimizer.step()
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import numbers
import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.checkpoint.state import stateful_kind
from torchfleet.collectives import UserCollectives
from torchfleet.compiled import compile_again, split_compiled
from torchfleet.errors import CheckpointError, ConfigurationError
from torchfleet.fleet_wrappers import (
    FleetDataLoader,
    FleetModule,
    FleetOptimizer,
    _unwrap,
    check_module,
    check_optimizers,
)
from torchfleet.loggers.base import agree_versions, claim_versions, save_loggers, use_versions
from torchfleet.preemption import restart_count
from torchfleet.samplers import shard_for_rank
from torchfleet.seed import add_worker_init_fn, reset_seed
from torchfleet.settings import TrainingSettings
from torchfleet.signals import PreemptionWatch
from torchfleet.watchdog import DEFAULT_HANG_TIMEOUT_S, parse_hang_timeout

if TYPE_CHECKING:
    from torchfleet.strategies.strategy import Strategy


# Fleet._backward_module before any setup() (None means "several modules: the caller names one").
_NOT_SET_UP = object()

#: What ``torchfleet run`` passes to every process it starts, read by ``Fleet()`` for the arguments left at their
#: defaults: argument -> (environment variable, the argument's default).
RUN_ENV: dict[str, tuple[str, Any]] = {
    "accelerator": ("TF_FLEET_ACCELERATOR", "auto"),
    "strategy": ("TF_FLEET_STRATEGY", "auto"),
    "devices": ("TF_FLEET_DEVICES", "auto"),
    "num_nodes": ("TF_FLEET_NUM_NODES", 1),
    "precision": ("TF_FLEET_PRECISION", None),
}


def _from_run_env(name: str, given: Any) -> Any:
    """``given``, or the value ``torchfleet run`` set for ``name`` when ``given`` is the default."""
    var, default = RUN_ENV[name]
    value = os.environ.get(var)
    if value is None:
        return given
    if given != default and str(given) != value:
        raise ConfigurationError(
            f"Fleet({name}={given!r}) disagrees with --{name.replace('_', '-')} {value} given to `torchfleet run` "
            f"({var}={value}). Give the value in one place: drop it from Fleet(...), or from the command line."
        )
    return int(value) if name == "num_nodes" else value


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


class Fleet(UserCollectives):
    """Run your own loop over any torchfleet strategy: same arguments, same strategies as the Trainer.

    ``training``: a TrainingSettings saying how the loop accumulates and clips gradients and its
    per-process batch size, for strategies that build their own configuration from it (DeepSpeed's
    gradient_accumulation_steps, gradient_clipping and train_micro_batch_size_per_gpu).

    ``max_restarts``: when a rank raises or dies, every rank is stopped and started again, up to this
    many times (default 0: fail at once): ``launch(fn)`` runs ``fn`` again in new ranks (ddp_spawn,
    ddp_fork), ``ddp`` re-runs the whole script. The loop resumes itself: ``fleet.restart_count`` says
    which start this is.
    ``hang_timeout``: seconds (or a timedelta) a rank may wait in one collective before every rank is
    stopped with a report of what each was doing (hang or desync, with call sites); default 300, None or 0: off.
    """

    def __init__(
        self,
        accelerator: Any = "auto",
        strategy: Any = "auto",
        devices: Any = "auto",
        num_nodes: int = 1,
        precision: Any = None,
        plugins: Any = None,
        callbacks: Any = None,
        loggers: Any = None,
        training: TrainingSettings | None = None,
        max_restarts: int = 0,
        hang_timeout: float | timedelta | None = DEFAULT_HANG_TIMEOUT_S,
    ) -> None:
        from torchfleet.connector import resolve

        accelerator, strategy, devices = (_from_run_env(n, v) for n, v in
                                          (("accelerator", accelerator), ("strategy", strategy), ("devices", devices)))
        num_nodes, precision = _from_run_env("num_nodes", num_nodes), _from_run_env("precision", precision)
        #: seconds a rank may wait in one collective before the watchdog stops the run (None: no watchdog)
        self.hang_timeout = parse_hang_timeout(hang_timeout, "Fleet")
        self._strategy = resolve(accelerator=accelerator, devices=devices, strategy=strategy, precision=precision,
                                 num_nodes=num_nodes, plugins=plugins, max_restarts=max_restarts,
                                 hang_timeout=self.hang_timeout)
        if training is not None and not isinstance(training, TrainingSettings):
            raise ConfigurationError(
                f"training={training!r} is not valid: give a torchfleet.TrainingSettings (accumulate_grad_batches, "
                "gradient_clip_val, gradient_clip_algorithm, micro_batch_size), or None for the defaults."
            )
        #: how this loop trains, told to the strategy at setup (DeepSpeed builds its config from it)
        self.training = training if training is not None else TrainingSettings()
        self.callbacks: list[Any] = _as_list(callbacks)
        self._loggers: list[Any] = _as_list(loggers)
        if self._loggers:  # a loop has no end the Fleet sees: what the loggers buffer is written when Python exits
            atexit.register(save_loggers, self._loggers)
        self._environment_ready = False
        self._launched = False
        self._set_up_modules: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self._backward_module: Any = _NOT_SET_UP
        #: SIGTERM/SIGUSR1/SIGINT, agreed across ranks after optimizer steps, once the loop reads preemption_requested
        self._preemption = PreemptionWatch()

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles the Fleet into every rank; what was set up here stays here (a WeakSet cannot travel)
        state = dict(self.__dict__)
        state["_set_up_modules"] = list(self._set_up_modules)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        modules = state.pop("_set_up_modules")
        self.__dict__.update(state)
        self._set_up_modules = weakref.WeakSet(modules)

    # ----------------------------------------------------------- properties
    @property
    def strategy(self) -> Strategy:
        """The Strategy built from the arguments (the same classes the Trainer uses)."""
        return self._strategy

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self._strategy.root_device

    @property
    def accelerator(self) -> Any:
        """The strategy's Accelerator."""
        return self._strategy.accelerator

    @property
    def global_rank(self) -> int:
        """This process's index among all processes (0 on one device)."""
        return self._strategy.global_rank

    @property
    def local_rank(self) -> int:
        """This process's index on its node."""
        return self._strategy.local_rank

    @property
    def node_rank(self) -> int:
        """This node's index among the nodes."""
        return self._strategy.node_rank

    @property
    def world_size(self) -> int:
        """The number of processes in the run."""
        return self._strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        """Whether this is global rank 0 (the process that writes checkpoints and logs)."""
        return self._strategy.is_global_zero

    @property
    def restart_count(self) -> int:
        """How many times this run was started again after a failure: 0 on the first start.

        torchfleet's own count (``max_restarts``), torchrun's (``TORCHELASTIC_RESTART_COUNT``) or SLURM's
        (``SLURM_RESTART_COUNT``). Above 0, a loop resumes from its newest checkpoint.
        """
        return restart_count()

    @property
    def loggers(self) -> list[Any]:
        """The loggers given to the constructor."""
        return self._loggers

    @property
    def logger(self) -> Any:
        """The first logger, or None."""
        return self._loggers[0] if self._loggers else None

    # --------------------------------------------------------------- launch
    def _ensure_environment(self) -> None:
        if not self._environment_ready:
            if not self._launched and self._ranks_not_started():
                strategy = self._strategy
                raise ConfigurationError(
                    f"fleet.setup() was called before fleet.launch(), but {type(strategy).__name__} runs "
                    f"{strategy.world_size} processes and only launch() starts them: this process would wait for the "
                    "others forever. Call fleet.launch() right after Fleet(...) (or fleet.launch(train) with "
                    "def train(fleet): ...), or start the script with torchrun or `torchfleet run`, which start "
                    "every process themselves."
                )
            # Fabric's fsdp and deepspeed re-seed when launch() sets up the processes (or Fabric() under its CLI),
            # before the program seeds; never at a first setup() under torchrun, after the model drew its weights
            if self._launched and "fleet" in self._strategy.reseeds_for:
                reset_seed()
            self._strategy.setup_environment()
            self._environment_ready = True
            claim_versions(self._loggers, self._strategy)  # rank 0 creates the version folders before any write
            if self._strategy.world_size > 1:  # every rank names the folder and run of rank 0, the only writer
                agree_versions(self._loggers, self._strategy)

    def _ranks_not_started(self) -> bool:
        """Whether the strategy's other processes exist only once launch() starts them."""
        launcher = self._strategy.launcher
        if launcher is None:
            return False
        if launcher.runs_in_children:  # spawn/fork: the ranks are new processes
            return True
        env = self._strategy.cluster_environment
        # torchrun, SLURM, mpirun, `torchfleet run` or our own re-run child: every process already runs
        return env is not None and not env.creates_processes_externally and self._strategy.num_processes > 1

    def launch(self, fn: Callable[..., Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        """Start the processes the strategy needs and run ``fn(fleet, *args, **kwargs)`` in each; returns its result.

        Without ``fn``, only starts the processes (a script launcher re-runs this script) and prepares this one.
        """
        launcher = self._strategy.launcher
        if fn is None:
            if launcher is not None and launcher.runs_in_children:
                raise ConfigurationError(
                    f"fleet.launch() without a function cannot work with {type(self._strategy).__name__}"
                    f"(start_method={getattr(launcher, 'start_method', '?')!r}): the ranks run in new processes, "
                    "and only a function can be sent to them. Pass the training function: fleet.launch(train), "
                    "with def train(fleet): ...; or use strategy='ddp', which re-runs the script."
                )
            fn = _do_nothing
        if launcher is not None and launcher.runs_in_children:
            # the ranks chose the loggers' versions: take rank 0's (a node other than the first gets None back)
            out, versions = launcher.launch(self._run_in_child, fn, *args, **kwargs) or (None, [])
            use_versions(self._loggers, versions)
            return out
        if launcher is not None:
            return launcher.launch(self._run_in_rank, fn, *args, **kwargs)
        return self._run_in_rank(fn, *args, **kwargs)

    def _run_in_child(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[Any]]:
        return self._run_in_rank(fn, *args, **kwargs), [lg.version for lg in self._loggers]

    def _run_in_rank(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._launched = True
        self._ensure_environment()
        completed = False
        try:
            out = fn(self, *args, **kwargs)
            completed = True
            return out
        finally:
            self._preemption.close(completed)

    @property
    def preemption_requested(self) -> bool:
        """Whether a SIGTERM/SIGUSR1/SIGINT asked the run to stop: the same on every rank, after the same step.

        The first read installs the handlers (until then, under torchfleet's launchers, a signal ends the job at
        once with exit code 75); then every ``optimizer.step()`` of an optimizer from ``setup`` checks, cheaply.
        Read it on every rank (once per iteration); when True, save with ``fleet.save`` and ``raise
        torchfleet.Preempted(...)`` (exit code 75). A rank whose steps stop coming stops without saving."""
        watch = self._preemption
        if watch.agreement is None:
            watch.start(self._strategy.world_size)
        return watch.signum is not None

    # ---------------------------------------------------------------- setup
    def setup(self, module: nn.Module, *optimizers: Optimizer, move_to_device: bool = True) -> Any:
        """Prepare ``module`` (and the optimizers built over its parameters) for this strategy.

        Returns the wrapped module, or ``(module, *optimizers)`` when optimizers are given.
        """
        # torch.compile(model): the strategy sets up the model inside, and its wrapper is compiled again below
        module, compile_settings = split_compiled(module)
        check_module(module, self._set_up_modules)
        check_optimizers(optimizers, module)
        self._ensure_environment()
        from torchfleet.module import Module

        if isinstance(module, Module):
            module.fabric = self  # the Module's door to the Fleet (running.FleetRunner)
        strategy = self._strategy
        strategy.configure_training(self.training)
        if move_to_device:
            wrapped, opts, _ = strategy.setup_module_and_optimizers(module, list(optimizers))
        else:
            wrapped = strategy.setup_module(strategy.precision.convert_module(module))
            opts = [strategy.setup_optimizer(o) for o in optimizers]
        self._set_up_modules.add(module)
        # backward() without model= uses the module when there is exactly one
        self._backward_module = wrapped if self._backward_module is _NOT_SET_UP else None
        # compiled outermost, over DDP / the fully_shard'ed module (torch's order); the strategy keeps the wrapper
        call = wrapped if compile_settings is None else compile_again(wrapped, compile_settings)
        fleet_module = FleetModule(wrapped, module, strategy.forward_context, strategy, call=call)
        if not optimizers:
            return fleet_module
        return (fleet_module, *[FleetOptimizer(o, strategy.optimizer_step, self._preemption) for o in opts])

    def setup_module(self, module: nn.Module, move_to_device: bool = True) -> FleetModule:
        """Prepare a module alone (its optimizers can follow with ``setup_optimizers``)."""
        return self.setup(module, move_to_device=move_to_device)

    def setup_optimizers(self, *optimizers: Optimizer) -> Any:
        """Wrap optimizers so ``step`` goes through the strategy; one object per optimizer given."""
        if not optimizers:
            raise ConfigurationError("fleet.setup_optimizers() was called with no optimizer; pass at least one.")
        check_optimizers(optimizers, None)
        strategy = self._strategy
        wrapped = [FleetOptimizer(strategy.setup_optimizer(o), strategy.optimizer_step, self._preemption)
                   for o in optimizers]
        return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)

    def setup_dataloaders(
        self, *dataloaders: Any, move_to_device: bool = True, use_distributed_sampler: bool = True
    ) -> Any:
        """Prepare dataloaders: each rank's part of the data (a sampler of yours dealt out), batches on the device.

        After ``seed_everything(workers=True)`` a loader with workers and no ``worker_init_fn`` of its own gets
        ``worker_init_function`` for this rank, as in the Trainer. Returns one object per dataloader given (a single
        object for one).
        """
        if not dataloaders:
            raise ConfigurationError("fleet.setup_dataloaders() was called with no dataloader; pass at least one.")
        strategy = self._strategy
        out = []
        for loader in dataloaders:
            if use_distributed_sampler:
                if strategy.world_size > 1:
                    loader = shard_for_rank(loader, strategy.distributed_sampler_kwargs, "fit",
                                            compare=strategy.all_gather_object)
                loader = strategy.process_dataloader(loader)
            loader = add_worker_init_fn(loader, self.global_rank)  # seed_everything(workers=True)
            out.append(FleetDataLoader(loader, strategy.batch_to_device if move_to_device else None))
        return out[0] if len(out) == 1 else tuple(out)

    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Create a module's parameters directly on the device, in the precision's parameter dtype.

        With ``empty_init=True`` sharded strategies (fsdp) create them on the meta device, without
        memory, and ``setup`` materialises only this process's shards; one device ignores it.
        """
        # "-mixed" precisions keep float32 parameters; "-true" ones create them in their dtype
        with self._strategy.module_init_context(empty_init):
            yield

    def init_tensor(self) -> contextlib.AbstractContextManager:
        """Create tensors directly on the device, in the precision's parameter dtype (Fabric's ``init_tensor``)."""
        return self._strategy.module_init_context(empty_init=False)

    # -------------------------------------------------------------- training
    def backward(self, loss: Tensor, *args: Any, model: nn.Module | None = None, **kwargs: Any) -> None:
        """Backpropagate ``loss`` through the strategy (gradient scaling, sharded engines).

        ``model`` names the module when several were set up; extra arguments go to ``Tensor.backward``.
        """
        module = self._backward_module if model is None else _unwrap(model)
        if module is _NOT_SET_UP:
            raise ConfigurationError(
                "fleet.backward() was called before fleet.setup(model, optimizer): set up the model first, so the "
                "strategy can scale and synchronise its gradients."
            )
        self._strategy.run_backward(loss, module, *args, **kwargs)  # Fabric's backward(tensor, module)

    def clip_gradients(
        self,
        module: nn.Module,
        optimizer: Any,
        clip_val: float | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor | None:
        """Clip by value (``clip_val``) or by total norm (``max_norm``: returns the norm before clipping)."""
        if (clip_val is None) == (max_norm is None):
            raise ConfigurationError(
                f"fleet.clip_gradients() got clip_val={clip_val!r} and max_norm={max_norm!r}; it takes exactly one "
                "of them: clip_val clamps each gradient element, max_norm scales gradients to a total norm."
            )
        if max_norm is not None:
            return self._strategy.clip_gradients_norm(_unwrap(module), _unwrap(optimizer), max_norm,
                                                      norm_type=norm_type, error_if_nonfinite=error_if_nonfinite)
        self._strategy.clip_gradients_value(_unwrap(module), _unwrap(optimizer), clip_val)
        return None

    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision's forward context, for computation outside the set-up module."""
        return self._strategy.forward_context()

    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> contextlib.AbstractContextManager:
        """Skip gradient synchronisation in the block (accumulate, then sync on the last micro-batch)."""
        if not isinstance(module, FleetModule):
            raise ConfigurationError(
                f"fleet.no_backward_sync() got a {type(module).__name__} that fleet.setup() did not return. Pass the "
                "module setup() returned: the strategy's wrapper is what skips the synchronisation."
            )
        return self._strategy.no_backward_sync(_unwrap(module), enabled=enabled)

    def to_device(self, obj: Any) -> Any:
        """Move a module, a tensor or nested collections of tensors to the device."""
        if isinstance(obj, nn.Module):
            return self._strategy.module_to_device(obj)
        from torchfleet.strategies.utils import move_to_device

        return move_to_device(obj, self.device)

    # ----------------------------------------------------------- collectives
    _collective_label = "fleet"  # all_gather, all_reduce, broadcast, barrier: collectives.UserCollectives

    def _collective_strategy(self) -> Strategy:
        return self._strategy

    @contextlib.contextmanager
    def rank_zero_first(self, local: bool = False) -> Iterator[None]:
        """Run the block in rank 0 first; the other processes enter it once rank 0 has left it.

        For work one process does for all (download a data set, build a cache) that the others then
        read. ``local=True``: local rank 0 of each node goes first (a node-local disk). The others
        wait without a timeout, as a download may outlast the collectives' timeout.
        """
        rank = self.local_rank if local else self.global_rank
        with self._strategy.unbounded_barrier() as wait:
            if rank > 0:
                wait()
            yield
            if rank == 0:
                wait()

    # ------------------------------------------------------------- checkpoints
    def save(self, path: str | os.PathLike, state: Mapping[str, Any]) -> None:
        """Save ``state``; modules and optimizers in it are saved as their state dicts (by the strategy)."""
        if not isinstance(state, Mapping):
            raise ConfigurationError(
                f"fleet.save() takes a dict of what to save, got {type(state).__name__}: "
                "fleet.save(path, {'model': model, 'optimizer': optimizer, 'step': step})."
            )
        self._strategy.save_state(path, {k: _unwrap(v) for k, v in state.items()})
        self._strategy.barrier("fleet.save")

    def load(self, path: str | os.PathLike, state: dict[str, Any] | None = None, strict: bool = True, *,
             weights_only: bool | None = None) -> dict[str, Any]:
        """Load ``path`` into ``state`` in place: modules and optimizers load their weights, other entries are
        replaced by the checkpoint's values. Returns the checkpoint's entries that ``state`` did not name.

        With ``strict``, every key of ``state`` must be in the checkpoint and module keys must match exactly.
        The file is read without running code from it; ``weights_only=False`` unpickles anything (a file you trust).
        """
        state = state if state is not None else {}
        unwrapped = {k: _unwrap(v) for k, v in state.items()}
        checkpoint = self._strategy.load_state(path, unwrapped, strict=strict, weights_only=weights_only)
        if strict:
            missing = [k for k in state if k not in checkpoint]
            if missing:
                raise CheckpointError(
                    f"The checkpoint {os.fspath(path)!r} has no entr{'y' if len(missing) == 1 else 'ies'} "
                    f"{', '.join(map(repr, missing))} asked for in state. Its entries are: "
                    f"{', '.join(map(repr, checkpoint))}. Pass strict=False to leave missing entries as they are."
                )
        for key, target in unwrapped.items():
            if key in checkpoint and stateful_kind(target) is None:
                state[key] = checkpoint[key]
        return {k: v for k, v in checkpoint.items() if k not in state}

    # ---------------------------------------------------------------- misc
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self.is_global_zero:
            builtins.print(*args, **kwargs)

    def seed_everything(self, seed: int | None = None, workers: bool = False) -> int:
        """Seed Python's, NumPy's and torch's generators; returns the seed used."""
        from torchfleet.seed import seed_everything

        return seed_everything(seed, workers=workers)

    def log(self, name: str, value: Any, step: int | None = None) -> None:
        """Send one metric to the loggers (rank 0 only)."""
        self.log_dict({name: value}, step=step)

    def log_dict(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Send metrics to the loggers (rank 0 only); tensors become floats. A value that is not a number or a
        one-element tensor is refused on every rank ("`list` values cannot be logged": Lightning's words)."""
        for name, value in metrics.items():
            if isinstance(value, Mapping):
                raise ConfigurationError(f"fleet.log_dict({{{name!r}: {{...}}}}): nested dictionaries cannot be logged; "
                                         "flatten them into names such as 'group/metric'.")
            if isinstance(value, bool) or not isinstance(value, (numbers.Number, Tensor)):
                raise ConfigurationError(f"fleet.log({name!r}, {value!r}): `{type(value).__name__}` values cannot be "
                                         "logged; log a number or a one-element tensor.")
        if not self.is_global_zero or not self._loggers:
            return
        plain = {k: v.item() if isinstance(v, Tensor) else v for k, v in metrics.items()}
        for lg in self._loggers:
            lg.log_metrics(metrics=plain, step=step)  # by keyword, as Fabric calls a logger

    def call(self, hook_name: str, *args: Any, **kwargs: Any) -> None:
        """Call ``hook_name(*args, **kwargs)`` on every callback that defines it."""
        for cb in self.callbacks:
            method = getattr(cb, hook_name, None)
            if callable(method):
                method(*args, **kwargs)


def _do_nothing(fleet: Fleet) -> None:
    return None
