"""What ``Fleet.setup`` hands back: the module, optimizer and dataloader wrappers that route through the strategy."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch import nn
from torch.optim import Optimizer

from torchfleet.optim_wrapper import OptimizerWrapper
from torchfleet.precision import Precision


def _no_context() -> Any:
    return Precision().forward_context()


# The full-precision forward context is one shared do-nothing object; FleetModule skips entering it.
_NO_CONTEXT = _no_context()


class FleetModule(nn.Module):
    """The user's module after ``Fleet.setup``: forward runs under the strategy's precision context.

    Attribute reads and writes, ``state_dict`` and ``load_state_dict`` reach the original module,
    so code written against the plain model keeps working. ``.module`` is the original module.
    """

    def __init__(self, wrapped: nn.Module, original: nn.Module, forward_context: Callable[[], Any]) -> None:
        super().__init__()
        self._forward_module = wrapped
        self._original_module = original
        # plain attributes (not submodule lookups through nn.Module.__getattr__), read on every call
        object.__setattr__(self, "_forward_context", forward_context)
        object.__setattr__(self, "_target", wrapped)
        object.__setattr__(self, "_original", original)

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
            return getattr(original, name)

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
    """A dataloader whose batches arrive on the strategy's device; ``len`` and ``set_epoch`` keep working."""

    def __init__(self, loader: Any, to_device: Callable[[Any], Any] | None) -> None:
        self._loader = loader
        self._to_device = to_device

    @property
    def loader(self) -> Any:
        """The (strategy-processed) dataloader inside."""
        return self._loader

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        if self._to_device is None:
            return iter(self._loader)
        # map runs in C: no Python generator frame resumed per batch
        return map(self._to_device, self._loader)

    def set_epoch(self, epoch: int) -> None:
        """Tell the sampler the epoch (a DistributedSampler reshuffles per epoch)."""
        for owner in (self._loader, getattr(self._loader, "batch_sampler", None)):
            sampler = getattr(owner, "sampler", None)
            set_epoch = getattr(sampler, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)
                return

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
