"""What a Trainer stage asks of its strategy around the loops: data for this rank, ``setup(trainer)``, ``teardown``.

Lightning's Trainer contract (strategies/trainer_contract.py): the strategy gets the stage's optimizer builder
and backward hooks (``configure_stage``), then ``setup(trainer)`` places and wraps the Module and builds the
optimizers; the Trainer then reads back ``model``, ``optimizers`` and ``lr_scheduler_configs``. Which of the
strategy's per-batch hooks the loops call is decided here, once per stage (``trainer._strategy_overrides``).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

from torchfleet.errors import MisconfiguredModuleError
from torchfleet.precision import CLIP_HOOKS
from torchfleet.precision import user_overrides as precision_overrides
from torchfleet.samplers import shard_for_rank, shuffled_for_training
from torchfleet.seed import add_worker_init_fn
from torchfleet.settings import TrainerStage
from torchfleet.strategies.trainer_contract import user_overrides
from torchfleet.trainer.optim import parse_optimizers, validate_schedulers
from torchfleet.trainer.replica_logging import REPLICA_LOGGING

if TYPE_CHECKING:
    from torchfleet.trainer.loop_trainer import LoopTrainer


def prepare_loader(trainer: LoopTrainer, loader: Any, stage: str) -> Any:
    """``loader`` for this rank: its share of the data (``distributed_sampler_kwargs``, unless
    ``use_distributed_sampler=False``: the user shards the data themselves), then ``Strategy.process_dataloader``."""
    strategy = trainer.strategy
    if trainer.use_distributed_sampler and strategy.world_size > 1:
        if stage == "fit" and not trainer.overfit_batches:
            loader = shuffled_for_training(loader)  # as Lightning's Trainer: a distributed training loader shuffles
        loader = shard_for_rank(loader, strategy.distributed_sampler_kwargs, stage, strategy.even_evaluation_shards,
                                compare=strategy.all_gather_object)
    loader = strategy.process_dataloader(loader)
    return add_worker_init_fn(loader, trainer.global_rank)  # seed_everything(workers=True)


def setup_strategy(trainer: LoopTrainer, model: Any, stage: str, micro_batch_size: int | None = None) -> None:
    """``strategy.setup(trainer)`` for ``stage``, told first how the Trainer trains and what the stage needs."""
    strategy = trainer.strategy
    fitting = stage == "fit"
    settings = trainer.training_settings(micro_batch_size)
    if not model.automatic_optimization:
        settings = dataclasses.replace(settings, manual_optimization=True)
    strategy.configure_training(settings, REPLICA_LOGGING)
    hooks = trainer._hooks

    def build_optimizers() -> tuple[list[Any], list[Any]]:
        # called by the strategy (setup_optimizers): before wrapping (ddp), or after sharding replaced the parameters
        opts, found = parse_optimizers(model.configure_optimizers())
        validate_schedulers(found, model.automatic_optimization, hooks.mod("lr_scheduler_step") is not None)
        if not opts and trainer.is_global_zero:
            warnings.warn("configure_optimizers() returned None: fit runs forward and backward but changes no weights "
                          "(global_step still counts each step, so max_steps ends the fit, as in Lightning).",
                          UserWarning, stacklevel=2)
        if model.automatic_optimization and len(opts) > 1:
            raise MisconfiguredModuleError(
                f"configure_optimizers() returned {len(opts)} optimizers, but automatic optimisation steps one. "
                "Set self.automatic_optimization = False and step them yourself in training_step "
                "(self.optimizers(), self.manual_backward(loss)), or combine the parameter groups in one optimizer."
            )
        return opts, found

    def present(name: str) -> bool:
        return bool(hooks.cb(name)) or hooks.mod(name) is not None

    def before_backward(loss: Any) -> None:
        hooks.call("on_before_backward", trainer, loss)

    def after_backward() -> None:
        hooks.call("on_after_backward", trainer)

    strategy.configure_stage(TrainerStage(
        stage,
        build_optimizers if fitting else None,
        before_backward if present("on_before_backward") else None,
        after_backward if present("on_after_backward") else None,
    ))
    trainer._strategy_overrides = user_overrides(strategy) | _precision_steps(strategy.precision)
    trainer._precision_clips = bool(precision_overrides(strategy.precision) & CLIP_HOOKS)
    strategy.setup(trainer)
    trainer.state.wrapped = strategy.model
    trainer.optimizers = list(strategy.optimizers)
    trainer.lr_scheduler_configs = list(strategy.lr_scheduler_configs)
    trainer._manual_optimizers = None


def teardown_strategy(trainer: LoopTrainer) -> None:
    """``strategy.teardown()``: the end of every stage (after an error too); the Trainer's ``model`` is then what the
    strategy leaves (the Module, unwrapped)."""
    strategy = trainer.strategy
    strategy.teardown()
    strategy.configure_stage(None)
    if trainer.state.wrapped is not None:
        trainer.state.wrapped = strategy.model


#: a Precision hook of Lightning's a user's class overrides -> the strategy step the Trainer then runs through
#: (Lightning's path: training_step and backward inside optimizer_step's closure, each step in its step context)
_PRECISION_STEPS = {"pre_backward": "training_step", "backward": "training_step", "post_backward": "training_step",
                    "optimizer_step": "training_step", "train_step_context": "training_step",
                    "val_step_context": "validation_step", "test_step_context": "test_step",
                    "predict_step_context": "predict_step"}


def _precision_steps(precision: Any) -> frozenset[str]:
    """The strategy steps to take where ``precision``'s class overrides Lightning's per-step Precision hooks."""
    return frozenset(_PRECISION_STEPS[name] for name in precision_overrides(precision) if name in _PRECISION_STEPS)
