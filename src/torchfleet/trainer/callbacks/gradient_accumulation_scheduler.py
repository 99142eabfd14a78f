"""GradientAccumulationScheduler: how many batches each optimizer step sums, changed at chosen epochs."""

from __future__ import annotations

import logging
from typing import Any

from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks.base import Callback

log = logging.getLogger("torchfleet")


class GradientAccumulationScheduler(Callback):
    """``scheduling={epoch: batches}``: from each listed epoch (0-based) on, sum the gradients of that many batches
    before each optimizer step; epochs before the first listed one use 1 (Lightning's callback and semantics).

    It sets ``trainer.accumulate_grad_batches`` at every ``on_train_epoch_start``; the fit loop reads it after that
    hook, so the epoch's steps, loss scaling (``loss / n``) and last partial window follow it. It refuses a Trainer
    given ``accumulate_grad_batches`` too, manual optimization, and strategies that accumulate inside their engine
    (deepspeed: its engine fixes the number when it is built).
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not isinstance(scheduling, dict) or not scheduling:
            raise ConfigurationError(
                f"GradientAccumulationScheduler(scheduling={scheduling!r}) is not valid: give a non-empty dict "
                "from epoch (an int >= 0) to the number of batches to accumulate (an int >= 1), e.g. {0: 1, 4: 2}.")
        bad_epochs = [k for k in scheduling if not isinstance(k, int) or isinstance(k, bool) or k < 0]
        bad_factors = [v for v in scheduling.values() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
        if bad_epochs or bad_factors:
            what = (f"the epochs {bad_epochs!r} are not ints >= 0" if bad_epochs
                    else f"the accumulation factors {bad_factors!r} are not ints >= 1")
            raise ConfigurationError(
                f"GradientAccumulationScheduler(scheduling={scheduling!r}) is not valid: {what}. Keys are epochs "
                "counted from 0, values the batches summed per optimizer step, e.g. {0: 1, 4: 2}.")
        self.scheduling = dict(scheduling)
        self.scheduling.setdefault(0, 1)
        self.epochs = sorted(self.scheduling)

    def going_to_accumulate_grad_batches(self) -> bool:
        """Whether any scheduled epoch accumulates more than one batch."""
        return any(v > 1 for v in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The number of batches summed per optimizer step in ``epoch``."""
        return self.scheduling[max(e for e in self.epochs if e <= epoch)]

    def on_train_start(self, trainer: Any, module: Any) -> None:
        if not module.automatic_optimization:
            raise ConfigurationError(
                "GradientAccumulationScheduler works only with automatic optimization: this Module sets "
                "automatic_optimization = False, so it steps its optimizers itself. Accumulate in training_step "
                "(step every n batches), or remove the callback.")
        if trainer.strategy.handles_gradient_accumulation and self.going_to_accumulate_grad_batches():
            raise ConfigurationError(
                f"GradientAccumulationScheduler cannot change the accumulation between epochs under "
                f"{type(trainer.strategy).__name__}: its engine fixes the number of accumulated batches when it is "
                "built. Use Trainer(accumulate_grad_batches=n) for one number throughout, or another strategy.")
        if trainer.accumulate_grad_batches != 1:
            raise ConfigurationError(
                f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) and GradientAccumulationScheduler "
                "both set the accumulation: remove accumulate_grad_batches from the Trainer (schedule it from epoch "
                "0 instead: {0: n}) or remove the callback.")
        overridden = [name for name in ("optimizer_step", "optimizer_zero_grad")
                      if getattr(type(module), name, None) is not getattr(_base_module(module), name, None)]
        if overridden and self.going_to_accumulate_grad_batches():
            log.warning("The Module overrides %s and GradientAccumulationScheduler accumulates batches: these hooks "
                        "run once per optimizer step, not once per batch.", " and ".join(overridden))

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)


def _base_module(module: Any) -> type:
    from torchfleet.module import Module

    return Module if isinstance(module, Module) else type(module)
