"""Calling callback and Module hooks: only the ones that are overridden, resolved once per run."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

_TRANSFER_HOOKS = ("on_before_batch_transfer", "on_after_batch_transfer")


class HookDispatcher:
    """Per-hook lists of the callback methods and the Module method that actually do something.

    Looking this up once per run keeps the per-batch cost of unused hooks at zero: the Trainer's
    overhead budget is a few microseconds per step.
    """

    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.module: Any = None
        self._cb: dict[str, list[Callable[..., Any]]] = {}
        self._cb_monitoring: dict[str, list[Callable[..., Any]]] = {}
        self._mod: dict[str, Callable[..., Any] | None] = {}
        #: (owner, hook name, bound method) -> what to call instead; set by a profiler for a stage (profiling.py)
        self.wrap: Callable[[Any, str, Callable[..., Any]], Callable[..., Any]] | None = None

    def build(self, callbacks: list[Any], module: Any) -> None:
        from torchfleet.module import Module
        from torchfleet.trainer.callbacks import Callback, EarlyStopping, ModelCheckpoint

        self.callbacks = callbacks
        self.module = module
        for c in callbacks:
            # as Lightning: a callback logs through the Module's self.log (a `log` method of its own wins)
            if module is not None and not hasattr(type(c), "log"):
                c.log, c.log_dict = module.log, module.log_dict
        self._cb.clear()
        self._cb_monitoring.clear()
        self._mod.clear()
        self._callback_base = Callback
        self._module_base = Module
        self._monitoring = (ModelCheckpoint, EarlyStopping)

    def cb(self, name: str) -> list[Callable[..., Any]]:
        """Bound callback methods overriding ``name``, in callback order (monitoring callbacks last)."""
        found = self._cb.get(name)
        if found is None:
            base = getattr(self._callback_base, name)
            plain, monitoring = [], []
            for c in self.callbacks:
                # a hook set on the instance (LambdaCallback, or c.on_fit_end = fn) counts as overridden too
                if getattr(type(c), name, base) is not base or name in getattr(c, "__dict__", ()):
                    fn = getattr(c, name) if self.wrap is None else self.wrap(c, name, getattr(c, name))
                    (monitoring if isinstance(c, self._monitoring) else plain).append(fn)
            self._cb[name] = found = plain + monitoring
            self._cb_monitoring[name] = monitoring
        return found

    def cb_split(self, name: str) -> tuple[list[Callable[..., Any]], list[Callable[..., Any]]]:
        """(ordinary callbacks, ModelCheckpoint/EarlyStopping) overriding ``name``: the latter run after the Module."""
        everything = self.cb(name)
        monitoring = self._cb_monitoring[name]
        return everything[: len(everything) - len(monitoring)], monitoring

    def mod(self, name: str) -> Callable[..., Any] | None:
        """The Module's bound ``name`` method if the user's class overrides it, else None."""
        if name not in self._mod:
            base = getattr(self._module_base, name, None)
            impl = getattr(type(self.module), name, None)
            fn = getattr(self.module, name) if impl is not None and impl is not base else None
            self._mod[name] = fn if fn is None or self.wrap is None else self.wrap(self.module, name, fn)
        return self._mod[name]

    def call(self, name: str, trainer: Any, *args: Any) -> None:
        """Callbacks' ``name`` (with trainer, module), then the Module's ``name`` (without them)."""
        self._call_callbacks(self.cb(name), name, trainer, args)
        fn = self.mod(name)
        if fn is not None:
            self.call_module(trainer, name, fn, *args)

    def call_module(self, trainer: Any, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run the Module hook ``fn`` with ``self.log`` defaults of ``name``, then restore the running hook's."""
        module = self.module
        previous = module.loop_door.current_fx
        trainer._current_fx(name)
        try:
            return fn(*args)
        finally:
            trainer._current_fx(previous)

    def call_module_between(self, name: str, trainer: Any, *args: Any, between: Callable[[], None] | None = None) -> None:
        """Ordinary callbacks, the Module, ``between()``, then the monitoring callbacks (they see what the Module logged)."""
        plain, monitoring = self.cb_split(name)
        self._call_callbacks(plain, name, trainer, args)
        mod = self.mod(name)
        if mod is not None:
            self.call_module(trainer, name, mod, *args)
        if between is not None:
            between()
        self._call_callbacks(monitoring, name, trainer, args)

    def _call_callbacks(self, fns: list[Callable[..., Any]], name: str, trainer: Any, args: tuple[Any, ...]) -> None:
        """Call ``fns`` with ``self.log`` defaults of the hook ``name`` (a callback's self.log is the Module's)."""
        module = self.module
        if not fns or module is None:
            for fn in fns:
                fn(trainer, module, *args)
            return
        previous = module.loop_door.current_fx
        trainer._current_fx(name)
        try:
            for fn in fns:
                fn(trainer, module, *args)
        finally:
            trainer._current_fx(previous)


def _datamodule_hook(dm: Any, name: str) -> Callable[..., Any] | None:
    """The DataModule's bound ``name`` if its class overrides DataModule's pass-through (or is duck-typed), else None."""
    from torchfleet.data import DataModule

    impl = getattr(type(dm), name, None)
    return getattr(dm, name) if impl is not None and impl is not getattr(DataModule, name) else None


def batch_transfer_fn(trainer: Any, dataloader_idx: int) -> Callable[[Any], Any]:
    """The batch move of a stage's loader ``dataloader_idx``, shared by fit (index 0) and evaluation.

    Lightning's order: DataModule then Module ``on_before_batch_transfer``, the Module's
    ``transfer_batch_to_device`` (then the precision's input conversion) or the strategy's
    ``batch_to_device``, DataModule then Module ``on_after_batch_transfer``. Built once per stage and
    loader: with no hook overridden it is ``strategy.batch_to_device`` itself (one call per batch). A strategy
    class that overrides ``batch_to_device`` gets Lightning's call, ``batch_to_device(batch, dataloader_idx=i)``.
    """
    hooks, strategy = trainer._hooks, trainer.strategy
    move: Callable[[Any], Any] = strategy.batch_to_device
    if "batch_to_device" in trainer._strategy_overrides:
        move = functools.partial(strategy.batch_to_device, dataloader_idx=dataloader_idx)
    before = hooks.mod("on_before_batch_transfer")
    dm = trainer.datamodule
    # one transfer runs: the DataModule's where it overrides it, else the Module's (Lightning chooses so too)
    custom = (dm is not None and _datamodule_hook(dm, "transfer_batch_to_device")) or hooks.mod("transfer_batch_to_device")
    after = hooks.mod("on_after_batch_transfer")
    dm_before, dm_after = (None, None) if dm is None else (_datamodule_hook(dm, n) for n in _TRANSFER_HOOKS)
    if before is None and custom is None and after is None and dm_before is None and dm_after is None:
        return move
    device = strategy.root_device
    convert = strategy.precision.convert_input
    idx = dataloader_idx

    def transfer(batch: Any) -> Any:
        if dm_before is not None:
            batch = dm_before(batch, idx)
        if before is not None:
            batch = before(batch, idx)
        batch = convert(custom(batch, device, idx)) if custom is not None else move(batch)
        if dm_after is not None:
            batch = dm_after(batch, idx)
        if after is not None:
            batch = after(batch, idx)
        return batch

    return transfer


def positional_capacity(fn: Callable[..., Any]) -> int | None:
    """How many positional arguments ``fn`` takes (None: any number, or its signature cannot be read)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def step_capacity(model: Any, name: str) -> int | None:
    """How many arguments the Module's step ``name`` takes after ``self``, read from its class: the instance's
    attribute may be a wrapper (fsdp registers its forward hooks around the steps) with another signature."""
    takes = positional_capacity(getattr(type(model), name, None) or getattr(model, name))
    return None if takes is None else max(takes - 1, 0)


def trim_step_arguments(step_fn: Callable[..., Any], model: Any, name: str, given: int) -> Callable[..., Any]:
    """``step_fn``, or when the Module's step ``name`` takes fewer than the ``given`` arguments (as Lightning
    allows: ``training_step(self, batch)``), a call that passes only the ones it takes. Decided once per stage."""
    takes = step_capacity(model, name)
    if takes is None or takes >= given:
        return step_fn

    def call(*args: Any) -> Any:
        return step_fn(*args[:takes])

    return call
