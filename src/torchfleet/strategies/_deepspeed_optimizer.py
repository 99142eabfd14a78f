"""The optimizer the Trainer and Fleet hold under DeepSpeedStrategy: the user's, stepped through the engine."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from torch.optim import Optimizer

from torchfleet.checkpoint.deepspeed import InEngine


class _Engine(Protocol):
    """What the optimizer calls of DeepSpeedStrategy (a Protocol, so that deepspeed.py alone imports this module)."""

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None) -> Any: ...
    def load_optimizer_state(self, optimizer: Optimizer, state: Mapping[str, Any]) -> None: ...


class _EngineOptimizer(Optimizer):
    """The optimizer the Trainer and Fleet hold under DeepSpeed: the user's, with step and zero_grad going to the engine.

    ZeRO runs the user's optimizer over its own float32 partitions and keeps their gradient buffers
    between steps; the Trainer's ``zero_grad(set_to_none=True)`` on the user's optimizer would drop
    them. The engine clears gradients itself in its step, so ``zero_grad`` here does nothing.
    ``param_groups`` and ``state`` are the user's (LR schedulers built over it keep working).
    """

    def __init__(self, optimizer: Optimizer, strategy: _Engine) -> None:
        # Optimizer.__init__ is not called: the parameters and hyperparameters are the wrapped optimizer's
        self._optimizer = optimizer
        self._strategy = strategy

    @property
    def optimizer(self) -> Optimizer:
        """The optimizer configure_optimizers() returned (DeepSpeed runs it over ZeRO's partitions)."""
        return self._optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self._optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self._optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self._optimizer.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: ``engine.step`` clears the gradients it used."""

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """``engine.step()`` (after ``closure``, when one is given)."""
        return self._strategy.optimizer_step(self, closure)

    def state_dict(self) -> dict[str, Any]:
        """A placeholder: the partitioned state is written by the engine's checkpoint."""
        return InEngine("optimizer")

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Loaded with the engine's checkpoint; see DeepSpeedStrategy.load_optimizer_state."""
        self._strategy.load_optimizer_state(self, state_dict)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_optimizer", "_strategy"):
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __repr__(self) -> str:
        return f"DeepSpeed({self._optimizer!r})"
