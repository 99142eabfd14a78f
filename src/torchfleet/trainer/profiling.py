"""Feeding the Trainer's profiler: its hooks and the strategy's steps are wrapped once when a stage starts.

With no profiler (``PassThroughProfiler``) nothing is wrapped, so the per-batch path is unchanged. With one,
each hook the HookDispatcher resolves is returned wrapped (``[Callback]ProgressBar.on_train_batch_end``,
``[Module]Net.on_train_epoch_end``), and the strategy's per-batch methods are shadowed on the instance for
the stage (``[Strategy]DDPStrategy.training_step``, ``.backward``, ``.optimizer_step``, ``.batch_to_device``);
``detach`` removes them and writes the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchfleet.trainer.loop_trainer import LoopTrainer

#: strategy methods the loops call per batch, timed under these names (``run_backward`` is the backward itself,
#: which Lightning's ``backward`` hook runs when a strategy overrides it)
_STRATEGY_METHODS = {"run_backward": "backward", "optimizer_step": "optimizer_step", "batch_to_device": "batch_to_device"}


def attach(trainer: LoopTrainer, stage: str) -> Callable[[], None] | None:
    """Start profiling ``stage``; returns the function that ends it (None when there is nothing to record)."""
    profiler = trainer.profiler
    if not profiler.records:
        return None
    strategy = trainer.strategy
    world = strategy.world_size
    profiler.setup(stage, local_rank=strategy.global_rank if world > 1 else None, log_dir=trainer.log_dir,
                   is_global_zero=strategy.is_global_zero)
    hooks = trainer._hooks
    module_name = type(trainer.module).__name__

    def label(owner: Any, hook: str) -> str:
        kind = "Module" if owner is trainer.module else "Callback"
        return f"[{kind}]{module_name if kind == 'Module' else type(owner).__name__}.{hook}"

    hooks.wrap = lambda owner, hook, fn: profiler.wrap(label(owner, hook), fn)
    prefix = f"[Strategy]{type(strategy).__name__}."
    for name, shown in _STRATEGY_METHODS.items():
        setattr(strategy, name, profiler.wrap(prefix + shown, getattr(strategy, name)))
    step_function = strategy.step_function

    def profiled_step_function(wrapped: Any, name: str) -> Any:
        return profiler.wrap(prefix + name, step_function(wrapped, name))

    strategy.step_function = profiled_step_function

    def detach() -> None:
        hooks.wrap = None
        for name in (*_STRATEGY_METHODS, "step_function"):
            strategy.__dict__.pop(name, None)
        try:
            profiler.describe()
        finally:
            profiler.teardown(stage)

    return detach
