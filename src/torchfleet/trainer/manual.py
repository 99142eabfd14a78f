"""The optimizer handle ``self.optimizers()`` returns: steps go through the strategy and count global steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch.optim import Optimizer

from torchfleet.optim_wrapper import OptimizerWrapper

if TYPE_CHECKING:
    from torchfleet.trainer.loop_trainer import LoopTrainer


class ManualOptimizer(OptimizerWrapper):
    """Wraps an optimizer for manual optimisation: ``step`` goes through the strategy (gradient scaling,
    sharded engines) and advances ``trainer.global_step``; everything else is the optimizer's own.

    Like Lightning's, it is an instance of the wrapped optimizer's class (``isinstance(opt, torch.optim.SGD)``).
    """

    def __init__(self, optimizer: Optimizer, trainer: LoopTrainer) -> None:
        super().__init__(optimizer)
        self.__dict__["_trainer"] = trainer

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        trainer = self._trainer
        trainer._hooks.call("on_before_optimizer_step", trainer, self._optimizer)
        if closure is None and "optimizer_step" in trainer._strategy_overrides:
            closure = _do_nothing  # as Lightning's: a strategy's optimizer_step(optimizer, closure) may call it
        out = trainer.strategy.optimizer_step(self._optimizer, closure, **kwargs)
        trainer.state.global_step += 1
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._trainer._hooks.call("on_before_zero_grad", self._trainer, self._optimizer)
        self._optimizer.zero_grad(set_to_none=set_to_none)


class HookOptimizer(OptimizerWrapper):
    """The optimizer an overridden ``Module.optimizer_step`` gets (automatic optimisation).

    An instance of the wrapped optimizer's class; ``step(closure=...)`` runs the fit loop's own step for it
    (``on_before_optimizer_step``, gradient clipping, the strategy's step, one more global step).
    """

    def __init__(self, optimizer: Optimizer, run_step: Callable[[Optimizer, Any, dict[str, Any]], Any]) -> None:
        super().__init__(optimizer)
        self.__dict__["_run_step"] = run_step

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        return self._run_step(self._optimizer, closure, kwargs)


def _do_nothing() -> None:
    return None
