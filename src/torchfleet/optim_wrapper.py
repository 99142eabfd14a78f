"""OptimizerWrapper: a handle on an optimizer that is also an instance of the optimizer's own class.

Fleet's ``setup`` and the Trainer's ``self.optimizers()`` hand one back: ``step`` goes through the
strategy, everything else reaches the wrapped optimizer, and ``isinstance(opt, torch.optim.SGD)``
holds, so learning-rate schedulers and ported code that check the type accept it.
"""

from __future__ import annotations

from typing import Any

from torch.optim import Optimizer

#: (wrapper class, optimizer class) -> the subclass of both, built once
_CLASSES: dict[tuple[type, type], type] = {}


class OptimizerWrapper:
    """Base of the optimizer handles; subclasses define ``step`` (and may define ``zero_grad``)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> OptimizerWrapper:
        if issubclass(cls, Optimizer):  # already the per-type subclass: copy.copy / deepcopy rebuild
            return object.__new__(cls)
        optimizer = args[0] if args else kwargs["optimizer"]
        key = (cls, type(optimizer))
        sub = _CLASSES.get(key)
        if sub is None:
            # a subclass of both; the optimizer's __init__ never runs on it
            sub = type(f"{cls.__name__}_{type(optimizer).__name__}", (cls, type(optimizer)),
                       {"__module__": cls.__module__})
            _CLASSES[key] = sub
        return object.__new__(sub)

    def __init__(self, optimizer: Optimizer) -> None:
        self.__dict__["_optimizer"] = optimizer

    @property
    def optimizer(self) -> Optimizer:
        """The wrapped optimizer."""
        return self.__dict__["_optimizer"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients."""
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state dict."""
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the optimizer."""
        self._optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the optimizer."""
        self._optimizer.add_param_group(param_group)

    # Optimizer methods inherited through the per-type subclass read these: keep them the optimizer's.
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The optimizer's parameter groups."""
        return self._optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self._optimizer.param_groups = value

    @property
    def state(self) -> Any:
        """The optimizer's per-parameter state."""
        return self._optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self._optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:
        """The optimizer's default hyperparameters."""
        return self._optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self._optimizer.defaults = value

    def __getattr__(self, name: str) -> Any:
        optimizer = self.__dict__.get("_optimizer")
        if optimizer is None:  # half-built (copy/pickle): avoid recursing into ourselves
            raise AttributeError(name)
        return getattr(optimizer, name)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        wrapper = next(c for c in type(self).__mro__ if issubclass(c, OptimizerWrapper) and not issubclass(c, Optimizer))
        return f"{wrapper.__name__}({self._optimizer!r})"
