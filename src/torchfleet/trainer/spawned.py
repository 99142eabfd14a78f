"""Bring a spawned or forked run's results back into the launching process's Trainer and model.

Under ddp_spawn / ddp_fork the launching process only waits while the ranks train in new
processes. Rank 0 sends back what the user reads after ``trainer.fit``: the model's weights,
the step and epoch counters, the metrics and each callback's state (so
``checkpoint_callback.best_model_path`` is set), and the loggers' versions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchfleet.loggers.base import use_versions
from torchfleet.strategies.utils import move_to_device

if TYPE_CHECKING:
    from torchfleet.trainer.loop_trainer import LoopTrainer


def run_in_rank(trainer: LoopTrainer, stage: str, model: Any, train_dl: Any, eval_dl: Any, ckpt_path: Any,
                kw: dict) -> Any:
    """Run the stage in this rank; rank 0 also returns the snapshot that ``restore`` applies in the parent."""
    from torchfleet.rank_zero import show_info_lines
    from torchfleet.trainer.stage import run_stage

    show_info_lines()  # a spawned rank built no Trainer: its rank 0 prints the stage's info lines as the parent would
    out = run_stage(trainer, stage, model, train_dl, eval_dl, ckpt_path, kw)
    if not trainer.is_global_zero:
        return None
    cpu = torch.device("cpu")
    return {
        "out": move_to_device(out, cpu),
        "model": {k: v.detach().to(cpu) for k, v in model.state_dict().items()},
        "state": move_to_device(trainer.state.snapshot(dict(trainer.callback_metrics),
                                                       dict(trainer.progress_bar_metrics)), cpu),
        "callbacks": [(type(cb).__qualname__, cb.state_dict()) for cb in trainer.callbacks],
        "logger_versions": [lg.version for lg in trainer.loggers],
    }


def restore(trainer: LoopTrainer, model: Any, snapshot: dict[str, Any] | None) -> Any:
    """Apply rank 0's snapshot to the parent's trainer and model; returns the stage's result."""
    if snapshot is None:  # not the main node: its rank 0 reports nothing back
        return None
    from torchfleet.strategies.utils import creation_context
    from torchfleet.trainer.stage import configure_model_once

    # layers made in configure_model() exist only in the ranks so far: make them here to take the weights
    configure_model_once(trainer, model, lambda: creation_context("cpu", trainer.strategy.precision.param_dtype))
    with torch.no_grad():
        model.load_state_dict(snapshot["model"])
    trainer.state.load_snapshot(snapshot["state"])
    # callbacks a Module adds in configure_callbacks exist only in the ranks: match by type, in order
    saved = list(snapshot["callbacks"])
    for cb in trainer.callbacks:
        for i, (name, state) in enumerate(saved):
            if name == type(cb).__qualname__:
                cb.load_state_dict(state)
                del saved[i]
                break
    use_versions(trainer.loggers, snapshot["logger_versions"])
    return snapshot["out"]

