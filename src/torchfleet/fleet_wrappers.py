"""What ``Fleet.setup`` hands back: the module, optimizer and dataloader wrappers that route through the strategy;
and the checks of what it is given (``check_module``, ``check_optimizers``)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim import Optimizer

from torchfleet.errors import ConfigurationError
from torchfleet.optim_wrapper import OptimizerWrapper
from torchfleet.precision import Precision
from torchfleet.samplers import set_sampler_epoch


def _no_context() -> Any:
    return Precision().forward_context()


# The full-precision forward context is one shared do-nothing object; FleetModule skips entering it.
_NO_CONTEXT = _no_context()


# Methods a module inherits from nn.Module (parameters, state_dict, train, to, ...): called on the set-up
# module they reach the original unwatched. ``forward`` and the call machinery are not among them.
_MODULE_METHODS = frozenset(
    n for n in dir(nn.Module) if callable(getattr(nn.Module, n, None))
) - {"forward", "__call__", "_call_impl", "_wrapped_call_impl"}
# Lightning's step methods: routed through the wrapper without being marked (as Fabric does)
_STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")


class _ForwardGuard:
    """Where Fleet watches for the user's layers running outside the strategy's forward (ddp, fsdp, ...).

    ``depth`` counts the calls of the set-up module (forward or a marked method) in progress; a layer
    of the module that runs while it is 0 ran outside the wrapper's forward. Nothing is watched on the
    hot path: an unmarked method is watched only while it runs, and a submodule only once it was
    fetched through the set-up module, and only from then on is forward counted.
    """

    def __init__(self, original: nn.Module, strategy_name: str, outside: str) -> None:
        self.depth = 0
        self.original = original
        self.strategy_name = strategy_name
        self.outside = outside
        self.watched: set[int] = set()  # ids of the submodules with a pre-hook
        self.forward_counted = False  # whether the set-up module's calls raise depth
        self._members: set[int] | None = None

    def refuses(self, module: nn.Module) -> bool:
        """Whether ``module`` running now would compute with the parameters outside forward in a way that breaks."""
        if self.depth:
            return False
        if self.outside == "never":
            return next(module.parameters(), None) is not None
        # without gradients (or with frozen layers) there is nothing to synchronise
        return torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())

    def why(self) -> str:
        if self.outside == "never":
            return ("its parameters are sharded across the processes and exist whole only inside the strategy's "
                    "forward")
        return ("gradients computed outside the strategy's forward are not synchronised between the processes, so "
                "the ranks' weights would silently differ")

    def members(self) -> set[int]:
        if self._members is None:  # the module's layers as they were when first needed
            self._members = {id(m) for m in self.original.modules()}
        return self._members

    def counted(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` with ``depth`` raised while it runs."""

        def counted_call(*args: Any, **kwargs: Any) -> Any:
            self.depth += 1
            try:
                return call(*args, **kwargs)
            finally:
                self.depth -= 1

        return counted_call

    def watched_method(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` (unmarked) run with a check that none of the module's layers with parameters runs inside it."""
        owner = _class_name(self.original)

        def hook(module: nn.Module, args: Any) -> None:
            if id(module) in self.members() and self.refuses(module):
                raise ConfigurationError(
                    f"{owner}.{name}() was called on the module fleet.setup() returned and ran its layer "
                    f"{_class_name(module)} outside the strategy's forward ({self.strategy_name}): {self.why()}. Mark the "
                    f"method once after setup, model.mark_forward_method({name!r}), so that its calls run through "
                    f"the strategy's forward, or compute through model(...) (forward)."
                )

        @functools.wraps(method)
        def watched(*args: Any, **kwargs: Any) -> Any:
            handle = register_module_forward_pre_hook(hook)
            try:
                return method(*args, **kwargs)
            finally:
                handle.remove()

        return watched

    def watch_submodule(self, attr: str, sub: nn.Module) -> bool:
        """Refuse ``sub`` (reached as ``model.<attr>``) running outside forward, from now on; False if it has no
        parameters (nothing to refuse)."""
        if next(sub.parameters(), None) is None:
            return False
        if id(sub) in self.watched:
            return True
        self.watched.add(id(sub))
        owner = _class_name(self.original)

        def hook(module: nn.Module, args: Any) -> None:
            if self.refuses(module):
                raise ConfigurationError(
                    f"model.{attr} ({_class_name(module)}) was called directly on the {owner} that fleet.setup() "
                    f"returned, outside the strategy's forward ({self.strategy_name}): {self.why()}. Call it from a method of "
                    f"{owner} and mark that method once after setup (model.mark_forward_method('name')), or from "
                    f"{owner}.forward."
                )

        sub.register_forward_pre_hook(hook)
        return True


class FleetModule(nn.Module):
    """The user's module after ``Fleet.setup``: forward runs under the strategy's precision context.

    Attribute reads and writes, ``state_dict`` and ``load_state_dict`` reach the original module,
    so code written against the plain model keeps working. ``.module`` is the original module.

    Under strategies whose wrapper must see the computation (ddp, fsdp, deepspeed, dp), other
    methods that compute with the parameters go through ``mark_forward_method``; the step methods
    (``training_step``, ...) are marked already. An unmarked method or a submodule called directly
    that runs the module's layers with gradients (fsdp, ZeRO-3: at all) is refused with an error.
    """

    def __init__(
        self, wrapped: nn.Module, original: nn.Module, forward_context: Callable[[], Any], strategy: Any = None,
        call: Callable[..., Any] | None = None,
    ) -> None:
        super().__init__()
        self._forward_module = wrapped
        self._original_module = original
        # plain attributes (not submodule lookups through nn.Module.__getattr__), read on every call;
        # `call` is what a call runs when it is not the wrapper itself (the wrapper compiled by torch.compile)
        object.__setattr__(self, "_forward_context", forward_context)
        object.__setattr__(self, "_target", wrapped if call is None else call)
        object.__setattr__(self, "_original", original)
        object.__setattr__(self, "_strategy", strategy)
        outside = strategy.outside_forward
        guard = None if outside == "allowed" else _ForwardGuard(original, _strategy_name(strategy), outside)
        object.__setattr__(self, "_guard", guard)
        marked = {n for n in _STEP_METHODS if inspect.ismethod(getattr(original, n, None))}
        object.__setattr__(self, "_marked", marked)
        object.__setattr__(self, "_routes", {})

    @property
    def module(self) -> nn.Module:
        """The module that was passed to ``setup``."""
        return self._original

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the (strategy-wrapped) module's forward under the precision context."""
        with self._forward_context():
            return self._target(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Skips nn.Module's call machinery for this thin wrapper (hooks live on the wrapped module)
        # and the context manager when the precision has none: the per-step budget is microseconds.
        context = self._forward_context()
        if context is _NO_CONTEXT:
            return self._target(*args, **kwargs)
        with context:
            return self._target(*args, **kwargs)

    def mark_forward_method(self, method: str | Callable[..., Any]) -> None:
        """Run calls of ``method`` (its name, or the bound method) through the strategy's forward, as ``forward`` runs.

        Needed for a loss computed by a method other than ``forward`` (``model.generator_step(z)``)
        under ddp, fsdp, deepspeed and dp: DDP synchronises only the gradients of work done in its
        forward, and fully_shard gathers the parameters there. On one device nothing changes.
        """
        name = self._method_name(method)
        self._marked.add(name)
        self._routes.pop(name, None)

    def _method_name(self, method: Any) -> str:
        original = self._original
        owner = _class_name(original)
        if isinstance(method, str):
            name = method
        elif inspect.ismethod(method) and method.__self__ in (original, self):
            name = method.__name__
        else:
            raise ConfigurationError(
                f"mark_forward_method() got {method!r}; it takes the name of a method of the {owner} given to "
                f"fleet.setup() ('generator_step') or that method itself (model.generator_step)."
            )
        if name == "forward":
            raise ConfigurationError(
                "mark_forward_method('forward') is not needed: calling the set-up module (model(...)) runs forward "
                "through the strategy already. Mark the other methods that compute with the parameters."
            )
        if name in _MODULE_METHODS or not inspect.ismethod(getattr(original, name, None)):
            raise ConfigurationError(
                f"mark_forward_method({name!r}): {owner} has no method {name!r} of its own to run through the "
                f"strategy's forward. Give the name of a method defined on {owner} that computes with its layers."
            )
        return name

    def _route(self, name: str) -> Callable[..., Any]:
        route = self._routes.get(name)
        if route is None:
            target = self._strategy.forward_method(self._forward_module, name)
            context = self._forward_context

            def through_forward(*args: Any, **kwargs: Any) -> Any:
                with context():
                    return target(*args, **kwargs)

            route = self._guard.counted(through_forward)
            self._routes[name] = route
        return route

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The original module's ``zero_grad`` (under fsdp it also clears the sharded gradients)."""
        self._original.zero_grad(set_to_none)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """The original module's state dict (keys without any wrapper prefix)."""
        return self._original.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:  # type: ignore[override]
        """Load into the original module."""
        return self._original.load_state_dict(state_dict, strict=strict, assign=assign)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            original = self.__dict__.get("_original")
            if original is None:  # half-built (copy/pickle): no original to ask
                raise
            value = getattr(original, name)
            guard = self.__dict__["_guard"]
            if guard is None or name in _MODULE_METHODS:
                return value
            # only code outside the module gets here (inside, `self` is the original): watch what it calls
            if name in self.__dict__["_marked"]:
                return self._route(name)
            if inspect.ismethod(value) and value.__self__ is original:
                return guard.watched_method(name, value)
            if isinstance(value, nn.Module):
                if guard.watch_submodule(name, value) and not guard.forward_counted:
                    # from now on forward says when it runs (one closure more per call, only from here on)
                    guard.forward_counted = True
                    object.__setattr__(self, "_target", guard.counted(self._target))
            return value

    def __setattr__(self, name: str, value: Any) -> None:
        # The wrapper's own state (set in __init__, `training`) stays here; anything else the user
        # sets after setup() belongs to their module, whose forward will read it.
        original = self.__dict__.get("_original")
        if original is None or name in self.__dict__:
            super().__setattr__(name, value)
        else:
            setattr(original, name, value)

    def __repr__(self) -> str:
        return f"FleetModule({self._original!r})"


def _strategy_name(strategy: Any) -> str:
    return type(strategy).__name__


def _class_name(module: nn.Module) -> str:
    """The user's class name (fully_shard puts its instances in a class ``FSDP<name>`` of its own)."""
    cls = type(module)
    bases = cls.__bases__
    if len(bases) == 2 and bases[0].__name__ == "FSDPModule":
        cls = bases[1]
    return cls.__name__


class FleetOptimizer(OptimizerWrapper):
    """The user's optimizer after ``Fleet.setup``: ``step`` goes through the strategy (gradient scaling,
    sharded engines); everything else is the optimizer's own.

    The object is an instance of the optimizer's own class too (``isinstance(opt, torch.optim.SGD)``),
    so learning-rate schedulers and other code that checks the type accept it.
    """

    def __init__(self, optimizer: Optimizer, step: Callable[..., Any], preemption: Any = None) -> None:
        super().__init__(optimizer)
        self.__dict__["_step"] = step
        #: the Fleet's PreemptionWatch: polled after each step once the loop asked for it
        self.__dict__["_preemption"] = preemption
        # bound straight to the optimizer: one call fewer per step
        self.__dict__["zero_grad"] = optimizer.zero_grad

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Step through the strategy (``closure`` computes loss and gradients first when given)."""
        out = self._step(self._optimizer, closure)
        watch = self._preemption
        if watch is not None and watch.agreement is not None:
            watch.poll()
        return out


class FleetDataLoader:
    """A dataloader whose batches arrive on the strategy's device, and whose samplers move to the next epoch.

    As Fabric's loader does, each pass (``iter()``) first tells the loader's sampler and its batch sampler's
    sampler the number of passes made before it (0, 1, 2, ...): a DistributedSampler reshuffles, a sampler of
    yours wrapped for the ranks draws anew, your own sampler's ``set_epoch`` hears of it. Without this every
    epoch of a multi-process run would read epoch 0's order again. ``set_epoch(n)`` makes the next pass epoch
    ``n`` (a resumed loop starting at epoch ``n``); a ``set_epoch`` called on the sampler itself is overridden
    by the count, as under Fabric. ``len`` keeps working.
    """

    def __init__(self, loader: Any, to_device: Callable[[Any], Any] | None) -> None:
        self._loader = loader
        self._to_device = to_device
        self._passes = 0  # Fabric's count of iter() calls: the epoch the next pass reads

    @property
    def loader(self) -> Any:
        """The (strategy-processed) dataloader inside."""
        return self._loader

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        set_sampler_epoch(self._loader, self._passes)
        self._passes += 1
        if self._to_device is None:
            return iter(self._loader)
        # map runs in C: no Python generator frame resumed per batch
        return map(self._to_device, self._loader)

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (the passes after it count on from there), telling the samplers now."""
        set_sampler_epoch(self._loader, epoch)
        self._passes = epoch

    def __getattr__(self, name: str) -> Any:
        loader = self.__dict__.get("_loader")
        if loader is None:
            raise AttributeError(name)
        return getattr(loader, name)


def _unwrap(obj: Any) -> Any:
    """The strategy-level object inside a Fleet wrapper (lists and tuples of optimizers too)."""
    if isinstance(obj, FleetModule):
        return obj._forward_module
    if isinstance(obj, FleetOptimizer):
        return obj.optimizer
    if isinstance(obj, (list, tuple)) and obj and any(isinstance(o, FleetOptimizer) for o in obj):
        return type(obj)(_unwrap(o) for o in obj)
    return obj


def _original(module: Any) -> Any:
    return module.module if isinstance(module, FleetModule) else module


def check_module(module: Any, set_up: Any) -> None:
    """Refuse what ``fleet.setup()`` cannot take as its module: one set up already (``set_up``), or no nn.Module."""
    if isinstance(module, FleetModule) or module in set_up:
        raise ConfigurationError(
            f"fleet.setup() was already called on this {type(_original(module)).__name__}. Set up each module "
            "once and keep using the object setup() returned."
        )
    if not isinstance(module, nn.Module):
        raise ConfigurationError(
            f"fleet.setup() takes an nn.Module first, got {type(module).__name__}. Pass the model, then its "
            "optimizers: fleet.setup(model, optimizer)."
        )


def check_optimizers(optimizers: tuple[Any, ...], module: nn.Module | None) -> None:
    """Refuse optimizers ``fleet.setup()`` cannot take: set up already, not optimizers, or over another module's
    parameters."""
    params = {id(p) for p in module.parameters()} if module is not None else None
    for i, opt in enumerate(optimizers):
        name = f"optimizer {i} ({type(opt).__name__})"
        if isinstance(opt, FleetOptimizer):
            raise ConfigurationError(
                f"The {name} given to fleet.setup() was already set up. Pass each optimizer once and keep "
                "using the object setup() returned."
            )
        if not isinstance(opt, Optimizer):
            raise ConfigurationError(
                f"fleet.setup() got {type(opt).__name__} as optimizer {i}; accepted are torch.optim.Optimizer "
                "objects, after the module: fleet.setup(model, optimizer)."
            )
        if params is None:
            continue
        foreign = [p for g in opt.param_groups for p in g["params"] if id(p) not in params]
        if foreign:
            raise ConfigurationError(
                f"The {name} holds {len(foreign)} parameter(s) that are not in the {type(module).__name__} "
                "given to fleet.setup(). Build each optimizer over the parameters of the module it is set up "
                "with (model.parameters()), and set up other models with their own optimizers."
            )
