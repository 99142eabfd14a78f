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

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.errors import ConfigurationError


def _no_context() -> Any:
    from torchfleet.precision import Precision

    return Precision().forward_context()


_NO_CONTEXT = _no_context()


class FleetModule(nn.Module):
    """The user's module after ``Fleet.setup``: forward runs under the strategy's precision context.

    Attribute access, ``state_dict`` and ``load_state_dict`` reach the original module, so code
    written against the plain model keeps working.
    """

    def __init__(self, wrapped: nn.Module, original: nn.Module, forward_context: Callable[[], Any]) -> None:
        super().__init__()
        self._forward_module = wrapped
        self._original_module = original
        # plain attributes (not submodule lookups through nn.Module.__getattr__), read on every call
        object.__setattr__(self, "_forward_context", forward_context)
        object.__setattr__(self, "_target", wrapped)

    @property
    def module(self) -> nn.Module:
        """The module that was passed to ``setup``."""
        return self._original_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self._forward_context():
            return self._forward_module(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Skips nn.Module's call machinery for this thin wrapper (hooks live on the wrapped module)
        # and the context manager when the precision has none: the per-step budget is microseconds.
        context = self._forward_context()
        if context is _NO_CONTEXT:
            return self._target(*args, **kwargs)
        with context:
            return self._target(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return self._original_module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:  # type: ignore[override]
        return self._original_module.load_state_dict(state_dict, strict=strict, assign=assign)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._original_module, name)


class FleetOptimizer:
    """The user's optimizer after ``Fleet.setup``: ``step`` goes through the strategy (gradient scaling,
    sharded engines); everything else is the optimizer's own."""

    def __init__(self, optimizer: Optimizer, step: Callable[..., Any]) -> None:
        self._optimizer = optimizer
        self._step = step

    @property
    def optimizer(self) -> Optimizer:
        return self._optimizer

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        return self._step(self._optimizer, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._optimizer.load_state_dict(state)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def __repr__(self) -> str:
        return f"FleetOptimizer({self._optimizer!r})"


class FleetDataLoader:
    """A dataloader whose batches arrive on the strategy's device."""

    def __init__(self, loader: Any, to_device: Callable[[Any], Any] | None) -> None:
        self._loader = loader
        self._to_device = to_device

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        move = self._to_device
        if move is None:
            yield from self._loader
            return
        for batch in self._loader:
            yield move(batch)

    def set_epoch(self, epoch: int) -> None:
        """Forward to the sampler (DistributedSampler reshuffles per epoch)."""
        sampler = getattr(self._loader, "sampler", None)
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def _unwrap(obj: Any) -> Any:
    if isinstance(obj, FleetModule):
        return obj._forward_module
    if isinstance(obj, FleetOptimizer):
        return obj.optimizer
    return obj


class Fleet:
    """Run your own loop over any torchfleet strategy: same arguments, same strategies as the Trainer."""

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
    ) -> None:
        from torchfleet.connector import resolve

        self.strategy = resolve(accelerator=accelerator, devices=devices, strategy=strategy, precision=precision,
                                num_nodes=num_nodes, plugins=plugins)
        self.callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else ([callbacks] if callbacks else [])
        self._loggers = list(loggers) if isinstance(loggers, (list, tuple)) else ([loggers] if loggers else [])
        self._environment_ready = False
        self._set_up_modules: set[int] = set()

    # ----------------------------------------------------------- properties
    @property
    def device(self) -> torch.device:
        return self.strategy.root_device

    @property
    def global_rank(self) -> int:
        return self.strategy.global_rank

    @property
    def local_rank(self) -> int:
        return self.strategy.local_rank

    @property
    def node_rank(self) -> int:
        return self.strategy.node_rank

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def loggers(self) -> list[Any]:
        return self._loggers

    @property
    def logger(self) -> Any:
        return self._loggers[0] if self._loggers else None

    # --------------------------------------------------------------- launch
    def _ensure_environment(self) -> None:
        if not self._environment_ready:
            self.strategy.setup_environment()
            self._environment_ready = True

    def launch(self, fn: Callable[..., Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        """Start the processes the strategy needs and run ``fn(fleet, *args, **kwargs)`` in each; returns its result.

        Without ``fn``, only prepares this process (for scripts started by torchrun/srun or on one device).
        """
        launcher = self.strategy.launcher
        if fn is None:
            self._ensure_environment()
            return None
        if launcher is not None:
            return launcher.launch(self._run_in_rank, fn, *args, **kwargs)
        return self._run_in_rank(fn, *args, **kwargs)

    def _run_in_rank(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._ensure_environment()
        return fn(self, *args, **kwargs)

    # ---------------------------------------------------------------- setup
    def setup(self, module: nn.Module, *optimizers: Optimizer, move_to_device: bool = True) -> Any:
        """Prepare ``module`` (and the optimizers built over its parameters) for this strategy.

        Returns the module, or ``(module, *optimizers)`` when optimizers are given.
        """
        self._ensure_environment()
        self._check_setup(module, optimizers)
        original = module
        from torchfleet.module import Module

        if isinstance(module, Module):
            object.__setattr__(module, "_fleet", self)
        if move_to_device:
            wrapped, opts = self.strategy.setup(module, list(optimizers))
        else:
            wrapped = self.strategy.setup_module(self.strategy.precision.convert_module(module))
            opts = [self.strategy.setup_optimizer(o) for o in optimizers]
        self._set_up_modules.add(id(original))
        fleet_module = FleetModule(wrapped, original, self.strategy.forward_context)
        if not optimizers:
            return fleet_module
        return (fleet_module, *[FleetOptimizer(o, self.strategy.optimizer_step) for o in opts])

    def setup_module(self, module: nn.Module, move_to_device: bool = True) -> FleetModule:
        """Prepare a module alone (optimizers can follow with ``setup_optimizers``)."""
        return self.setup(module, move_to_device=move_to_device)

    def setup_optimizers(self, *optimizers: Optimizer) -> Any:
        """Wrap optimizers so ``step`` goes through the strategy; one object per optimizer given."""
        wrapped = [FleetOptimizer(self.strategy.setup_optimizer(o), self.strategy.optimizer_step) for o in optimizers]
        return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)

    def _check_setup(self, module: nn.Module, optimizers: tuple[Optimizer, ...]) -> None:
        if isinstance(module, FleetModule) or id(module) in self._set_up_modules:
            raise ConfigurationError(
                f"fleet.setup() was already called on this {type(module).__name__}. Set up each module once and keep "
                "using the object setup() returned."
            )
        if not isinstance(module, nn.Module):
            raise ConfigurationError(f"fleet.setup() takes an nn.Module first, got {type(module).__name__}.")
        params = {id(p) for p in module.parameters()}
        for i, opt in enumerate(optimizers):
            if isinstance(opt, FleetOptimizer):
                raise ConfigurationError(f"Optimizer {i} passed to fleet.setup() was already set up.")
            if not isinstance(opt, Optimizer):
                raise ConfigurationError(
                    f"fleet.setup() got {type(opt).__name__} as optimizer {i}; pass torch.optim.Optimizer objects."
                )
            foreign = [p for g in opt.param_groups for p in g["params"] if id(p) not in params]
            if foreign:
                raise ConfigurationError(
                    f"Optimizer {i} ({type(opt).__name__}) holds {len(foreign)} parameter(s) that are not in the "
                    f"{type(module).__name__} given to fleet.setup(). Build the optimizer over "
                    "module.parameters() of the same module."
                )

    def setup_dataloaders(self, *dataloaders: Any, move_to_device: bool = True, use_distributed_sampler: bool = True) -> Any:
        """Prepare dataloaders: a distributed sampler where the strategy needs one, batches moved to the device."""
        out = []
        for loader in dataloaders:
            if use_distributed_sampler:
                loader = self.strategy.process_dataloader(loader, "fit")
            out.append(FleetDataLoader(loader, self.strategy.batch_to_device if move_to_device else None))
        return out[0] if len(out) == 1 else tuple(out)

    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Create a module's parameters directly on the device, in the precision's parameter dtype."""
        dtype = getattr(self.strategy.precision, "param_dtype", torch.float32)
        previous = torch.get_default_dtype()
        try:
            with torch.device(self.device):
                if dtype.is_floating_point and dtype != previous:
                    torch.set_default_dtype(dtype)
                yield
        finally:
            torch.set_default_dtype(previous)

    # -------------------------------------------------------------- training
    def backward(self, loss: Tensor, *args: Any, model: nn.Module | None = None, **kwargs: Any) -> None:
        """Backpropagate ``loss`` through the strategy (gradient scaling, sharded engines)."""
        if not self._set_up_modules:
            raise ConfigurationError(
                "fleet.backward() was called before fleet.setup(model, optimizer): set up the model first, so the "
                "strategy can scale and synchronise its gradients."
            )
        self.strategy.backward(loss, model if model is None else _unwrap(model), *args, **kwargs)

    def clip_gradients(
        self,
        module: nn.Module,
        optimizer: Any,
        clip_val: float | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor | None:
        """Clip by value (``clip_val``) or by total norm (``max_norm``, returns the norm before clipping)."""
        if (clip_val is None) == (max_norm is None):
            raise ConfigurationError(
                "fleet.clip_gradients() takes exactly one of clip_val (clip each gradient element) and max_norm "
                "(scale gradients to a total norm)."
            )
        if max_norm is not None:
            return self.strategy.clip_gradients_norm(_unwrap(module), _unwrap(optimizer), max_norm,
                                                     norm_type=norm_type, error_if_nonfinite=error_if_nonfinite)
        self.strategy.clip_gradients_value(_unwrap(module), _unwrap(optimizer), clip_val)
        return None

    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision's forward context, for computation outside the set-up module."""
        return self.strategy.forward_context()

    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> contextlib.AbstractContextManager:
        """Skip gradient synchronisation in the block (accumulate, then sync on the last micro-batch)."""
        return self.strategy.no_backward_sync(_unwrap(module), enabled=enabled)

    def to_device(self, obj: Any) -> Any:
        """Move a tensor, a module or nested tensors to the device."""
        if isinstance(obj, nn.Module):
            return obj.to(self.device)
        from torchfleet.strategies.base import move_to_device

        return move_to_device(obj, self.device)

    # ----------------------------------------------------------- collectives
    def all_reduce(self, data: Any, reduce_op: str = "mean") -> Any:
        """Reduce tensors (or nested collections of them) across processes."""
        from torchfleet.module import _apply_tensors

        return _apply_tensors(data, lambda t: self.strategy.reduce(t, op=reduce_op))

    def all_gather(self, data: Any, sync_grads: bool = False) -> Any:
        """Gather tensors from every process, stacked along a new first dimension."""
        from torchfleet.module import _apply_tensors

        return _apply_tensors(data, lambda t: self.strategy.all_gather(t, sync_grads=sync_grads))

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self.strategy.broadcast(obj, src=src)

    def barrier(self, name: str | None = None) -> None:
        self.strategy.barrier(name)

    # ------------------------------------------------------------- checkpoints
    def save(self, path: str | os.PathLike, state: Mapping[str, Any]) -> None:
        """Save ``state``; modules and optimizers in it are saved as their state dicts (by the strategy)."""
        self.strategy.save_checkpoint(path, {k: _unwrap(v) for k, v in state.items()})
        self.strategy.barrier("fleet.save")

    def load(self, path: str | os.PathLike, state: dict[str, Any] | None = None, strict: bool = True) -> dict[str, Any]:
        """Load ``path`` into the modules/optimizers in ``state`` (in place); plain values in ``state`` are
        updated too. Returns the checkpoint's entries that ``state`` did not name."""
        state = state if state is not None else {}
        checkpoint = self.strategy.load_checkpoint(path, {k: _unwrap(v) for k, v in state.items()}, strict=strict)
        for key in list(state):
            if key in checkpoint and not isinstance(_unwrap(state[key]), (nn.Module, Optimizer)):
                state[key] = checkpoint[key]
        return {k: v for k, v in checkpoint.items() if k not in state}

    # ---------------------------------------------------------------- misc
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self.is_global_zero:
            print(*args, **kwargs)

    def seed_everything(self, seed: int | None = None, workers: bool = False) -> int:
        from torchfleet.trainer.trainer import seed_everything

        return seed_everything(seed, workers=workers)

    def log(self, name: str, value: Any, step: int | None = None) -> None:
        self.log_dict({name: value}, step=step)

    def log_dict(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Send metrics to the loggers (rank 0 only)."""
        if not self.is_global_zero:
            return
        plain = {k: float(v) for k, v in metrics.items()}
        for lg in self._loggers:
            lg.log_metrics(plain, step=step)

    def call(self, hook_name: str, *args: Any, **kwargs: Any) -> None:
        """Call ``hook_name`` on every callback that has it."""
        for cb in self.callbacks:
            method = getattr(cb, hook_name, None)
            if callable(method):
                method(*args, **kwargs)
