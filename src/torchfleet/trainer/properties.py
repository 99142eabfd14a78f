"""The Trainer's read-only views: the model and its wrapper, devices and ranks, stage flags, metrics, callbacks.

A base of Trainer (split from trainer.py by job); everything here reads the Trainer's state, its strategy or its
callbacks, and writes nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from torchfleet.trainer.progress import FitProgress, trainer_loops
from torchfleet.trainer.state import TrainerStatus

if TYPE_CHECKING:
    from torchfleet.precision import Precision
    from torchfleet.trainer.state import RunState


class TrainerProperties:
    """Lightning's Trainer properties that ported code reads (``trainer.model``, ``trainer.world_size``, ...)."""

    # the Trainer's, read here
    state: RunState
    strategy: Any
    module: Any
    _loggers: list[Any]
    callbacks: list[Any]
    datamodule: Any
    default_root_dir: str
    stage: Any
    sanity_checking: bool
    limit_val_batches: Any
    val_dataloaders: Any
    max_steps: int
    max_epochs: int
    num_training_batches: int | float
    accumulate_grad_batches: int
    _preemption: Any
    _received_sigterm: bool

    @property
    def model(self) -> Any:
        """The model as the strategy runs it (a DistributedDataParallel wrapper under ddp); the Module before setup."""
        return self.state.wrapped if self.state.wrapped is not None else self.module

    @property
    def lightning_module(self) -> Any:
        """The Module itself, never a wrapper (Lightning's name; ``trainer.model`` is the strategy's wrapper)."""
        return self.module

    @property
    def interrupted(self) -> bool:
        """Whether the latest stage ended by an exception (``trainer.state.status`` is INTERRUPTED)."""
        return self.state.status is TrainerStatus.INTERRUPTED

    @property
    def accelerator(self) -> Any:
        return self.strategy.accelerator

    @property
    def precision(self) -> str:
        return self.strategy.precision.name

    @property
    def precision_plugin(self) -> Precision:
        """The strategy's precision object (Lightning's ``trainer.precision_plugin``)."""
        return self.strategy.precision

    @property
    def device_ids(self) -> list[int]:
        return self.strategy.device_ids

    @property
    def num_devices(self) -> int:
        return len(self.device_ids)

    @property
    def num_nodes(self) -> int:
        return self.strategy.num_nodes

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def global_rank(self) -> int:
        return self.strategy.global_rank

    @property
    def local_rank(self) -> int:
        return self.strategy.local_rank

    @property
    def node_rank(self) -> int:
        return self.strategy.node_rank

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def loggers(self) -> list[Any]:
        """The loggers, first the one ``logger`` names (an empty list for none)."""
        return self._loggers

    @loggers.setter
    def loggers(self, loggers: list[Any] | None) -> None:  # as Lightning: None means no logger
        self._loggers = list(loggers) if loggers else []

    @property
    def logger(self) -> Any:
        return self.loggers[0] if self.loggers else None

    @logger.setter
    def logger(self, logger: Any) -> None:
        self.loggers = [] if logger is None else [logger]

    @property
    def log_dir(self) -> str:
        if self.loggers and getattr(self.loggers[0], "log_dir", None):
            return self.loggers[0].log_dir
        return self.default_root_dir

    @property
    def training(self) -> bool:
        return self.state.fn == "fit" and not self.sanity_checking and self.state.in_train

    @property
    def validating(self) -> bool:
        return self.state.fn == "validate" or (self.state.fn == "fit" and not self.state.in_train)

    @property
    def testing(self) -> bool:
        return self.state.fn == "test"

    @property
    def predicting(self) -> bool:
        return self.state.fn == "predict"

    @property
    def evaluating(self) -> bool:
        """Validating (the sanity check included) or testing."""
        return self.validating or self.testing

    @property
    def enable_validation(self) -> bool:
        """Whether fit validates: the Module has a ``validation_step``, there is validation data and
        ``limit_val_batches`` is not 0."""
        from torchfleet.utilities.model_helpers import is_overridden

        data = self.val_dataloaders is not None or any(
            is_overridden("val_dataloader", owner) for owner in (self.datamodule, self.module))
        return bool(self.limit_val_batches) and is_overridden("validation_step", self.module) and data

    @property
    def received_sigterm(self) -> bool:
        """Whether SIGTERM reached this process during the running (or last) fit (it then stops, see preemption)."""
        import signal

        running = self._preemption
        return self._received_sigterm or (running is not None and running.flag.signum == signal.SIGTERM)

    @property
    def scaler(self) -> Any:
        """The precision's gradient scaler ("16-mixed"), else None."""
        return getattr(self.strategy.precision, "scaler", None)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """``num_replicas`` and ``rank`` of this process's DistributedSampler; None for a one-process strategy."""
        return self.strategy.distributed_sampler_kwargs

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on local rank 0 of each machine (Lightning's ``Trainer.print``)."""
        if self.local_rank == 0:
            print(*args, **kwargs)

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """Latest value of everything logged (epoch aggregates after an epoch end)."""
        out: dict[str, torch.Tensor] = {}
        if self.state.train_results is not None:
            for v in self.state.train_results.values.values():
                if v.on_step:
                    out[v.name] = v.latest
                    if v.on_epoch:  # as Lightning: also under the names the loggers get
                        out[f"{v.name}_step"] = v.latest
                        if v.name in self.state.epoch_metrics:
                            out[f"{v.name}_epoch"] = self.state.epoch_metrics[v.name]
        out.update(self.state.epoch_metrics)
        return out

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """What the progress bar shows: values logged with prog_bar=True, as floats."""
        out: dict[str, float] = {}
        if self.state.train_results is not None:
            for v in self.state.train_results.values.values():
                if v.prog_bar and v.on_step:
                    out[f"{v.name}_step" if v.on_epoch else v.name] = float(v.latest)
        for k, v in self.state.bar_metrics.items():
            out[k] = float(v) if isinstance(v, torch.Tensor) else v
        return out

    @property
    def checkpoint_callbacks(self) -> list[Any]:
        from torchfleet.trainer.callbacks import ModelCheckpoint

        return [c for c in self.callbacks if isinstance(c, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> Any:
        cbs = self.checkpoint_callbacks
        return cbs[0] if cbs else None

    @property
    def early_stopping_callbacks(self) -> list[Any]:
        from torchfleet.trainer.callbacks import EarlyStopping

        return [c for c in self.callbacks if isinstance(c, EarlyStopping)]

    @property
    def early_stopping_callback(self) -> Any:
        cbs = self.early_stopping_callbacks
        return cbs[0] if cbs else None

    @property
    def progress_bar_callback(self) -> Any:
        """The progress bar callback, or None when ``enable_progress_bar=False``."""
        from torchfleet.trainer.callbacks import ProgressBar

        return next((c for c in self.callbacks if isinstance(c, ProgressBar)), None)

    @property
    def fit_loop(self) -> FitProgress:
        """The fit loop's counters as Lightning's ``trainer.fit_loop`` shows them to callbacks (epoch and batch
        progress, ``epoch_loop.val_loop``); ``max_epochs``/``max_steps``/``min_epochs``/``min_steps`` can be changed
        through it."""
        return trainer_loops(self)["fit"]

    validate_loop = property(lambda self: trainer_loops(self)["validate"], doc="trainer.validate()'s batch counters.")
    test_loop = property(lambda self: trainer_loops(self)["test"], doc="trainer.test()'s batch counters.")
    predict_loop = property(lambda self: trainer_loops(self)["predict"], doc="trainer.predict()'s batch counters.")

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps the fit will take (max_steps, or epochs x batches per epoch / accumulation)."""
        if self.max_steps != -1:
            return self.max_steps
        if self.max_epochs == -1 or math.isinf(self.num_training_batches):
            return float("inf")
        per_epoch = math.ceil(self.num_training_batches / self.accumulate_grad_batches)
        return per_epoch * self.max_epochs
