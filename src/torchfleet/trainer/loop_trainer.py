"""The Trainer as its loops see it: the Protocol the stage, loop, checkpoint and preemption code names.

trainer/trainer.py calls the loops (stage.py, spawned.py, checkpointing.py, ...); they are handed the Trainer and
read or write what is declared here. Naming this Protocol rather than the Trainer class keeps them from importing
trainer/trainer.py back (even for annotations). It names types only from modules below the loops; the Trainer
has every member (tests/test_loop_door.py checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from torchfleet.running import ModuleRunner

if TYPE_CHECKING:
    import os

    from torchfleet.module import Module
    from torchfleet.settings import TrainingSettings
    from torchfleet.strategies.strategy import Strategy
    from torchfleet.trainer.hooks import HookDispatcher
    from torchfleet.trainer.state import RunState


class LoopTrainer(ModuleRunner, Protocol):
    """What the Trainer's loops read and write on it (the public names are Lightning's, documented on Trainer), on
    top of what the Module asks of it (``ModuleRunner``: the ranks, loggers, optimizers, global step, ...)."""

    # where the run is, what runs it, who is told
    state: RunState
    strategy: Strategy
    module: Module
    datamodule: Any
    callbacks: list[Any]
    profiler: Any
    _hooks: HookDispatcher
    #: the per-batch Lightning hooks the strategy's class overrides (Trainer.__init__)
    _strategy_overrides: frozenset[str]
    _precision_clips: bool
    _manual_optimizers: list[Any] | None
    #: the running fit's preemption watch (trainer/preemption.py's FitPreemption), else None
    _preemption: Any
    _received_sigterm: bool
    _detect_anomaly: bool
    _max_epochs_defaulted: bool

    # the arguments, as the Trainer checked them
    max_epochs: int
    min_epochs: int
    max_steps: int
    min_steps: int
    limit_train_batches: int | float
    limit_val_batches: int | float
    limit_test_batches: int | float
    limit_predict_batches: int | float
    overfit_batches: int | float
    val_check_interval: int | float
    val_check_seconds: float | None
    check_val_every_n_epoch: int | None
    num_sanity_val_steps: int
    log_every_n_steps: int
    accumulate_grad_batches: int
    gradient_clip_val: float | None
    gradient_clip_algorithm: str | None
    deterministic: Any
    benchmark: bool | None
    use_distributed_sampler: bool
    inference_mode: bool
    enable_model_summary: bool
    reload_dataloaders_every_n_epochs: int
    default_root_dir: str
    ckpt_path: str | None

    # what the loops set up and the callbacks read
    num_training_batches: int | float
    num_val_batches: list[int]
    num_test_batches: list[int]
    num_predict_batches: list[int]
    num_sanity_val_batches: list[int]
    train_dataloader: Any
    val_dataloaders: Any
    test_dataloaders: Any
    predict_dataloaders: Any
    is_last_batch: bool
    should_stop: bool
    sanity_checking: bool

    # read-only views (trainer/properties.py's properties; the loops only read them)
    lightning_module: Any
    fit_loop: Any
    is_global_zero: bool
    callback_metrics: dict[str, Any]
    progress_bar_metrics: dict[str, Any]
    checkpoint_callback: Any
    checkpoint_callbacks: list[Any]
    log_dir: str | None

    # what the loops call
    def _current_fx(self, name: str) -> None: ...

    def training_settings(self, micro_batch_size: int | None = None) -> TrainingSettings: ...

    def save_checkpoint(self, filepath: str | os.PathLike, weights_only: bool = False,
                        storage_options: Any = None) -> None: ...
