"""Trainer: runs a Module's fit/validate/test/predict over any Strategy, with callbacks and loggers."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from torchfleet.collectives import UserCollectives
from torchfleet.errors import ConfigurationError, check_int
from torchfleet.rank_zero import show_info_lines
from torchfleet.settings import TrainingSettings, clip_arguments
from torchfleet.trainer import arguments as args
from torchfleet.trainer import runs
from torchfleet.trainer.arguments import default
from torchfleet.trainer.hooks import HookDispatcher
from torchfleet.trainer.properties import TrainerProperties
from torchfleet.trainer.state import RunState, TrainerStatus
from torchfleet.watchdog import DEFAULT_HANG_TIMEOUT_S, parse_hang_timeout

log = logging.getLogger("torchfleet")


def _state_field(name: str, doc: str) -> property:
    """A Trainer attribute that reads and writes ``trainer.state.<name>``."""
    return property(lambda self: getattr(self.state, name), lambda self, value: setattr(self.state, name, value),
                    doc=doc)


class Trainer(TrainerProperties, UserCollectives):
    """Train, evaluate and predict with a ``Module`` on the strategy, devices and precision you choose.

    The model code never changes between one CPU, one GPU, N processes or N machines: only
    ``strategy=``, ``accelerator=``, ``devices=``, ``num_nodes=`` and ``precision=`` do. An argument left at None
    takes its value from ``torchfleet.trainer.arguments.DEFAULTS`` (``torchfleet fit --help`` shows them); a value
    that is not accepted raises a ConfigurationError here, before anything runs.

    Args:
        accelerator: "cpu", "cuda", "gpu", "mps" or "auto" (a GPU when present, else the CPU), or an Accelerator.
        strategy: how the work is spread: "auto", "single_device", "ddp", "ddp_spawn", "ddp_fork", "fsdp",
            "deepspeed", ... (`torchfleet strategies` lists them and which can run here), or a Strategy object.
        devices: devices per machine: an int (on the CPU, that many processes), a list of GPU indices, "0,1",
            -1 for every GPU, or "auto".
        num_nodes: how many machines take part.
        precision: "32-true", "64-true", "16-mixed", "bf16-mixed", "16-true" or "bf16-true"; not given: a Precision
            plugin's or the strategy object's, else "32-true".
        plugins: extra parts: a ClusterEnvironment, a CheckpointIO (e.g. AsyncCheckpointIO), a Precision.
        logger: a Logger, a list of them, False for none; default: a TensorBoardLogger in ``default_root_dir/logs``
            when tensorboard is installed, else a CSVLogger there.
        callbacks: Callback objects (ModelCheckpoint, EarlyStopping, LearningRateMonitor, ...).
        fast_dev_run: True (1) or n: run n training and evaluation batches once to check the code, logging nothing.
        max_epochs: stop after this many epochs (-1: no limit). Left unset, there is no limit either when max_steps
            or max_time is given.
        min_epochs: train at least this many epochs, even if a callback asks to stop.
        max_steps: stop after this many optimizer steps (-1: no limit).
        min_steps: take at least this many optimizer steps, even if a callback asks to stop.
        max_time: stop after this much time: "DD:HH:MM:SS", a dict (days=, hours=, ...) or a timedelta.
        limit_train_batches: training batches per epoch: an int, or a float fraction of the dataloader.
        limit_val_batches: validation batches each time: an int, or a float fraction (0 disables validation).
        limit_test_batches: test batches: an int, or a float fraction.
        limit_predict_batches: predict batches: an int, or a float fraction.
        overfit_batches: train, validate and test on this many batches of the training data (an int, or a float
            fraction), unshuffled, to check that the model can fit them; 0 (default) is off.
        val_check_interval: validate after this fraction of each epoch (float), every n training batches (int), or
            every so much time ("DD:HH:MM:SS", a timedelta or a dict such as {"minutes": 30}).
        check_val_every_n_epoch: validate every n epochs; None counts val_check_interval batches across epochs.
        num_sanity_val_steps: validation batches run before training to catch bugs early (-1: all).
        log_every_n_steps: send the logged training values to the loggers every n optimizer steps.
        enable_checkpointing: add a ModelCheckpoint when callbacks has none.
        enable_progress_bar: show a progress bar.
        enable_model_summary: log the model's layers and parameter counts at fit start.
        accumulate_grad_batches: sum gradients over n batches before each optimizer step.
        gradient_clip_val: clip gradients to this value (by norm unless gradient_clip_algorithm says "value").
        gradient_clip_algorithm: "norm" or "value".
        deterministic: True: use deterministic algorithms only; "warn": warn where one is not; None: torch's default.
        benchmark: set torch.backends.cudnn.benchmark (None: leave it, unless deterministic turns it off).
        use_distributed_sampler: give each process its share of the data (a DistributedSampler) automatically.
        default_root_dir: the folder for logs and checkpoints when loggers and callbacks name none (default: cwd).
        inference_mode: evaluate under torch.inference_mode (True) or torch.no_grad (False).
        sync_batchnorm: turn BatchNorm layers into synchronised ones, so statistics cover every process's batch.
        profiler: time every hook and step: "simple", "advanced" (cProfile), "pytorch" (torch.profiler), or a
            Profiler object; each rank writes a report in the log folder.
        auto_resume: when the run is a restart (torchfleet's, torchrun's or SLURM's restart count above 0), fit
            resumes from the newest complete checkpoint under default_root_dir by itself (default True; False starts
            afresh).
        max_restarts: when a rank of a multi-process run (ddp, ddp_spawn, ddp_fork, fsdp, deepspeed) raises or
            dies, every rank is stopped and started again, resuming from the newest complete checkpoint, up to this
            many times (default 0: the run fails at once). ddp re-runs the whole script.
        hang_timeout: seconds (or a timedelta) a rank may wait in one collective before every rank is stopped with a
            report of what each was doing (hang or desync, with call sites and stacks); default 300, None or 0: off.
        barebones: switch off everything that costs speed (checkpointing, loggers, progress bar, model summary,
            sanity check, self.log, profiler) to measure the loop itself; giving one of them too is refused.
        detect_anomaly: run the stages under torch.autograd.set_detect_anomaly (slow; finds the op that made a NaN).
        reload_dataloaders_every_n_epochs: ask for the training and validation dataloaders again every n epochs
            (0: once per fit).
    """

    def __init__(
        self,
        *,
        accelerator: Any = "auto",
        strategy: Any = "auto",
        devices: Any = "auto",
        num_nodes: int = 1,
        precision: Any = None,
        plugins: Any = None,
        logger: Any = None,
        callbacks: Any = None,
        fast_dev_run: bool | int = False,
        max_epochs: int | None = None,
        min_epochs: int | None = None,
        max_steps: int = -1,
        min_steps: int | None = None,
        max_time: Any = None,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0.0,
        val_check_interval: int | float | str | timedelta | dict | None = None,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int | None = None,
        log_every_n_steps: int | None = None,
        enable_checkpointing: bool | None = None,
        enable_progress_bar: bool | None = None,
        enable_model_summary: bool | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
        deterministic: bool | str | None = None,
        benchmark: bool | None = None,
        use_distributed_sampler: bool = True,
        default_root_dir: str | os.PathLike | None = None,
        inference_mode: bool = True,
        sync_batchnorm: bool = False,
        profiler: Any = None,
        auto_resume: bool = True,
        max_restarts: int = 0,
        hang_timeout: float | timedelta | None = DEFAULT_HANG_TIMEOUT_S,
        barebones: bool = False,
        detect_anomaly: bool = False,
        reload_dataloaders_every_n_epochs: int = 0,
    ) -> None:
        from torchfleet.connector import resolve

        show_info_lines()
        args.check_switches(barebones=barebones, detect_anomaly=detect_anomaly)
        #: every feature that costs speed switched off (arguments.barebones_overrides lists them)
        self.barebones = barebones
        if barebones:
            (enable_checkpointing, logger, enable_progress_bar, enable_model_summary, log_every_n_steps,
             num_sanity_val_steps) = args.barebones_overrides(locals()).values()
        #: the stages run under torch.autograd.set_detect_anomaly (Lightning's private name)
        self._detect_anomaly = detect_anomaly
        #: the training and validation dataloaders are asked for again every n epochs (0: once per fit)
        self.reload_dataloaders_every_n_epochs = check_int(
            "reload_dataloaders_every_n_epochs", reload_dataloaders_every_n_epochs, 0, "Trainer",
            meaning="epochs between requests of the dataloaders; 0: once per fit")

        #: seconds a rank may wait in one collective before the watchdog stops the run (None: no watchdog)
        self.hang_timeout = parse_hang_timeout(hang_timeout, "Trainer")
        # Every argument error is raised here, before anything runs.
        self.strategy = resolve(
            accelerator=accelerator,
            devices=devices,
            strategy=strategy,
            precision=precision,
            num_nodes=num_nodes,
            plugins=plugins,
            max_restarts=max_restarts,
            hang_timeout=self.hang_timeout,
        )
        #: strategy="auto": resolve's arguments, for fit to choose again by the model's memory (trainer/auto_strategy.py)
        self._auto_request = None if not (isinstance(strategy, str) and strategy == "auto") else dict(
            accelerator=accelerator, devices=devices, precision=precision, num_nodes=num_nodes, plugins=plugins,
            max_restarts=max_restarts, hang_timeout=self.hang_timeout)
        #: seconds between validations when val_check_interval is a duration, else None
        self.val_check_seconds: float | None = None
        if isinstance(val_check_interval, (str, timedelta, dict)):
            self.val_check_seconds = args.parse_val_check_time(val_check_interval)
            val_check_interval = None
        args.check_loop_args(
            fast_dev_run, max_epochs, min_epochs, max_steps, min_steps, val_check_interval, check_val_every_n_epoch,
            log_every_n_steps, num_sanity_val_steps, deterministic, self.val_check_seconds,
        )
        args.check_switches(enable_checkpointing=enable_checkpointing, enable_progress_bar=enable_progress_bar,
                            enable_model_summary=enable_model_summary, use_distributed_sampler=use_distributed_sampler,
                            inference_mode=inference_mode, sync_batchnorm=sync_batchnorm)
        args.check_root_dir(default_root_dir)
        loggers = args.check_logger(logger)
        if benchmark is not None and not isinstance(benchmark, bool):
            raise ConfigurationError(f"benchmark={benchmark!r} is not valid: give True, False or None (leave "
                                     "torch.backends.cudnn.benchmark as it is).")
        # validates them too; the strategy gets them at setup (configure_training)
        settings = TrainingSettings(accumulate_grad_batches, gradient_clip_val,
                                    default("gradient_clip_algorithm", gradient_clip_algorithm))
        loggers = self._init_loop_limits(
            fast_dev_run, loggers, max_epochs, min_epochs, max_steps, min_steps, max_time, limit_train_batches,
            limit_val_batches, limit_test_batches, limit_predict_batches, overfit_batches, val_check_interval,
            check_val_every_n_epoch, num_sanity_val_steps, log_every_n_steps)
        self.accumulate_grad_batches = settings.accumulate_grad_batches
        self.gradient_clip_val = settings.gradient_clip_val
        self.gradient_clip_algorithm = settings.gradient_clip_algorithm
        self._gradient_clip_algorithm_given = gradient_clip_algorithm  # None: Module.clip_gradients may choose
        self.deterministic = deterministic
        if benchmark and deterministic:
            warnings.warn("Trainer(deterministic=True, benchmark=True): cuDNN's benchmark mode picks kernels by "
                          "timing them, which can make results differ between runs despite deterministic=True.",
                          UserWarning, stacklevel=2)
        #: torch.backends.cudnn.benchmark for the run (None: False when deterministic, else left as it is)
        self.benchmark = False if benchmark is None and deterministic else benchmark
        if self.benchmark is not None:
            torch.backends.cudnn.benchmark = self.benchmark
        self.use_distributed_sampler = use_distributed_sampler
        self.inference_mode = inference_mode
        #: BatchNorm layers become SyncBatchNorm under ddp/fsdp (batch statistics over every process's batch)
        self.sync_batchnorm = bool(sync_batchnorm)
        if not isinstance(auto_resume, bool):
            raise ConfigurationError(f"auto_resume={auto_resume!r} is not valid: give True (a restarted run resumes "
                                     "from its newest checkpoint) or False.")
        #: a restarted run (TORCHELASTIC_RESTART_COUNT or SLURM_RESTART_COUNT > 0) resumes from its newest checkpoint
        self.auto_resume = auto_resume
        self.default_root_dir = os.fspath(default_root_dir) if default_root_dir is not None else os.getcwd()
        self.enable_progress_bar = default("enable_progress_bar", enable_progress_bar)
        self.enable_checkpointing = default("enable_checkpointing", enable_checkpointing)
        self.enable_model_summary = default("enable_model_summary", enable_model_summary)

        from torchfleet.profilers import resolve as resolve_profiler

        #: times the hooks and steps of each stage (``profiler="simple" | "advanced" | "pytorch"``); see profilers/
        self.profiler = resolve_profiler(profiler)
        self.loggers = self._default_loggers() if loggers is None else loggers
        self.callbacks = self._build_callbacks(callbacks, max_time)

        self._init_run_attributes()

    def _init_loop_limits(self, fast_dev_run: bool | int, loggers: Any, max_epochs: int | None,
                          min_epochs: int | None, max_steps: int, min_steps: int | None, max_time: Any,
                          limit_train_batches: Any, limit_val_batches: Any, limit_test_batches: Any,
                          limit_predict_batches: Any, overfit_batches: Any, val_check_interval: Any,
                          check_val_every_n_epoch: int | None, num_sanity_val_steps: int | None,
                          log_every_n_steps: int | None) -> Any:
        """How long the loops run and how much of each loader they read (``fast_dev_run`` and ``overfit_batches``
        override the limits); the loggers to use (``fast_dev_run`` swaps them for a DummyLogger)."""
        self.fast_dev_run = fast_dev_run
        dev_batches = int(fast_dev_run) if fast_dev_run else 0
        if dev_batches:
            max_epochs, max_steps = 1, dev_batches
            limit_train_batches = limit_val_batches = limit_test_batches = limit_predict_batches = dev_batches
            num_sanity_val_steps, val_check_interval, check_val_every_n_epoch = 0, 1.0, 1
            self.val_check_seconds = None  # a duration means nothing for a run of a few batches
            # as Lightning, checkpointing is not switched off: ModelCheckpoint saves nothing under fast_dev_run
            from torchfleet.loggers import DummyLogger

            # as Lightning: the loggers record nothing, but code that uses self.logger still runs
            loggers = [DummyLogger()] if loggers is None or loggers else []
        # a time budget alone runs until it is spent, as Lightning
        self._max_epochs_defaulted = max_epochs is None and max_steps == -1 and max_time is None
        self.max_epochs = max_epochs if max_epochs is not None else (
            default("max_epochs", None) if max_steps == -1 and max_time is None else -1)
        self.min_epochs = default("min_epochs", min_epochs)
        self.max_steps = max_steps
        self.min_steps = default("min_steps", min_steps)
        self.limit_train_batches = args.check_limit("limit_train_batches", default("limit_train_batches", limit_train_batches))
        self.limit_val_batches = args.check_limit("limit_val_batches", default("limit_val_batches", limit_val_batches))
        self.limit_test_batches = args.check_limit("limit_test_batches", default("limit_test_batches", limit_test_batches))
        self.limit_predict_batches = args.check_limit(
            "limit_predict_batches", default("limit_predict_batches", limit_predict_batches)
        )
        #: train and validate on the same first batches, in order, every epoch (a debugging aid, as Lightning)
        self.overfit_batches = args.check_limit("overfit_batches", overfit_batches)
        if self.overfit_batches:
            self.limit_train_batches = self.limit_val_batches = self.overfit_batches
        args.note_single_batches(dev_batches, limit_train_batches, limit_val_batches, limit_test_batches,
                                 limit_predict_batches, overfit_batches, val_check_interval)
        self.val_check_interval = default("val_check_interval", val_check_interval)
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.num_sanity_val_steps = default("num_sanity_val_steps", num_sanity_val_steps)
        self.log_every_n_steps = default("log_every_n_steps", log_every_n_steps)
        return loggers

    def _init_run_attributes(self) -> None:
        """The attributes the stages fill in as they run (Lightning's names), empty until the first stage."""
        #: where the run is: the loops read and write it; checkpoints save and restore it through it
        self.state = RunState()
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list[Any] = []
        self.num_training_batches: int | float = float("inf")
        self.num_val_batches: list[int] = []
        self.num_test_batches: list[int] = []
        self.num_predict_batches: list[int] = []
        self.num_sanity_val_batches: list[int] = []
        #: the loaders of the latest stage as the strategy runs them (with its sampler); Lightning's names. The
        #: evaluation ones are one loader, or a list when there are several
        self.train_dataloader: Any = None
        self.val_dataloaders: Any = None
        self.test_dataloaders: Any = None
        self.predict_dataloaders: Any = None
        #: whether the training batch running now is the epoch's last
        self.is_last_batch = False
        self.module: Any = None
        self._preemption: Any = None  # the running fit's FitPreemption (trainer/preemption.py)
        self._received_sigterm = False  # whether the last fit got SIGTERM
        self.datamodule: Any = None
        self.ckpt_path: str | None = None
        self._hooks = HookDispatcher()
        self._manual_optimizers: list[Any] | None = None
        #: the per-batch Lightning hooks the strategy's class overrides: the loops call those (decided at each setup)
        self._strategy_overrides: frozenset[str] = frozenset()
        #: the precision's class overrides Lightning's clipping hooks: the Module's clip_gradients calls them
        self._precision_clips = False

    def _current_fx(self, name: str) -> None:
        # which hook is running decides where self.log records by default: the Module's door says it (a plain
        # attribute write: this runs every step)
        self.module.loop_door.current_fx = name

    # ------------------------------------------------------------------ the Module's door (running.ModuleRunner)
    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """The backward of the running Module's ``self.manual_backward(loss)`` (manual optimisation).

        Lightning's: the strategy's backward, without an optimizer; its default runs the Module's and callbacks'
        ``on_before_backward`` / ``on_after_backward`` around the backward itself.
        """
        self.strategy.backward(loss, None, *args, **kwargs)

    def gradient_clip_arguments(self, gradient_clip_val: float | None,
                                gradient_clip_algorithm: str | None) -> tuple[float | None, str]:
        """What the running Module's ``self.clip_gradients`` clips with: the arguments given, else this Trainer's
        ``gradient_clip_val`` / ``gradient_clip_algorithm`` (a value that differs from one given here is refused)."""
        return clip_arguments(gradient_clip_val, gradient_clip_algorithm, self.gradient_clip_val,
                              self._gradient_clip_algorithm_given)

    def manual_optimizers(self) -> list[Any]:
        """The optimizers as the running Module's ``self.optimizers()`` returns them: each step goes through the
        strategy and counts a global step (trainer/manual.py)."""
        from torchfleet.trainer.manual import ManualOptimizer

        if self._manual_optimizers is None or len(self._manual_optimizers) != len(self.optimizers):
            self._manual_optimizers = [ManualOptimizer(o, self) for o in self.optimizers]
        return self._manual_optimizers

    # ------------------------------------------------------------------ setup helpers
    def _default_loggers(self) -> list[Any]:
        # as Lightning: TensorBoard when it is installed (so logger.experiment.add_image works), else CSV
        from torchfleet.loggers import CSVLogger, TensorBoardLogger
        from torchfleet.utilities.imports import package_available

        default = TensorBoardLogger if package_available("tensorboard") else CSVLogger
        return [default(self.default_root_dir, name="logs")]

    def _build_callbacks(self, callbacks: Any, max_time: Any) -> list[Any]:
        from torchfleet.trainer.callbacks import ModelCheckpoint, ProgressBar, Timer
        from torchfleet.trainer.callbacks.base import Checkpoint

        cbs = args.check_callbacks(callbacks)
        if max_time is not None:
            budget = Timer(max_time, interval="step")  # a max_time that is no duration is refused either way
            if any(isinstance(c, Timer) for c in cbs):  # as Lightning (its words first): the Timer given wins
                log.warning("Ignoring `Trainer(max_time=%r)`, callbacks list already contains a Timer: its own "
                            "duration is the time budget. Pass one of the two.", max_time)
            else:
                cbs.append(budget)
        if self.enable_progress_bar and not any(isinstance(c, ProgressBar) for c in cbs):
            cbs.append(ProgressBar())
        if not self.enable_progress_bar:
            cbs = [c for c in cbs if not isinstance(c, ProgressBar)]
        # as Lightning: any checkpoint-writing callback (ModelCheckpoint, OnExceptionCheckpoint) counts
        writers = [type(c).__name__ for c in cbs if isinstance(c, Checkpoint)]
        if self.enable_checkpointing and not writers:
            cbs.append(ModelCheckpoint())
        if not self.enable_checkpointing and writers:
            raise ConfigurationError(
                f"Trainer was configured with `enable_checkpointing=False` but found `{writers[0]}` in callbacks "
                f"list (callbacks=[...] holds one). Remove the {writers[0]}, or pass enable_checkpointing=True."
            )
        return cbs

    def training_settings(self, micro_batch_size: int | None = None) -> TrainingSettings:
        """What the strategy is told about this Trainer's training (``Strategy.configure_training``)."""
        return TrainingSettings(self.accumulate_grad_batches, self.gradient_clip_val, self.gradient_clip_algorithm,
                                micro_batch_size, sync_batchnorm=self.sync_batchnorm)

    # ------------------------------------------------------------------ properties
    current_epoch = _state_field("current_epoch", "Epochs done; during an epoch, its index.")
    global_step = _state_field("global_step", "Optimizer steps taken.")
    should_stop = _state_field("should_stop", "Set True (a callback, the model) to end fit at the next check.")
    stage = _state_field("fn", 'The running entry point: "fit", "validate", "test", "predict", or None. Another name of '
                               '``trainer.state.fn``, which torchfleet reads; not ``trainer.state.stage``, which says '
                               'what runs inside the entry point ("train", "sanity_check", "validate", ...).')
    sanity_checking = _state_field("sanity_checking", "Whether the sanity check's validation is running.")
    logged_metrics = _state_field("logged_metrics", "What was last sent to the loggers.")

    # ------------------------------------------------------------------ entry points
    def fit(
        self,
        model: nn.Module,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: Any = None,
        ckpt_path: str | os.PathLike | None = None, weights_only: bool | None = None,
    ) -> None:
        """Train ``model``; ``ckpt_path`` (a file, or "last") resumes a run exactly where it stopped."""
        self._run("fit", model, train_dataloaders, val_dataloaders, datamodule, ckpt_path, weights_only=weights_only)

    def validate(
        self, model: nn.Module | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
        verbose: bool = True, datamodule: Any = None, weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """Run the validation loop once; returns one dict of epoch metrics per dataloader."""
        return self._run("validate", model, None, dataloaders, datamodule, ckpt_path, verbose=verbose, weights_only=weights_only)

    def test(
        self, model: nn.Module | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
        verbose: bool = True, datamodule: Any = None, weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """Run the test loop once; returns one dict of epoch metrics per dataloader."""
        return self._run("test", model, None, dataloaders, datamodule, ckpt_path, verbose=verbose, weights_only=weights_only)

    def predict(
        self, model: nn.Module | None = None, dataloaders: Any = None, datamodule: Any = None,
        return_predictions: bool = True, ckpt_path: str | None = None, weights_only: bool | None = None,
    ) -> list[Any] | None:
        """Run ``predict_step`` over the dataloaders; returns the predictions (a list per dataloader when several)."""
        return self._run("predict", model, None, dataloaders, datamodule, ckpt_path,
                         return_predictions=return_predictions, weights_only=weights_only)

    def estimate_memory(self, model: nn.Module, train_dataloaders: Any = None, datamodule: Any = None) -> Any:
        """``torchfleet.estimate_memory`` with this Trainer's strategy, devices, nodes and precision, on the first
        batch of the training loader (given, the datamodule's, or the model's ``train_dataloader``)."""
        from torchfleet.planner.estimate import estimate_memory, first_batch

        return estimate_memory(model, first_batch(model, train_dataloaders, datamodule), strategy=self.strategy,
                               devices=self.num_devices, num_nodes=self.num_nodes, precision=self.strategy.precision)

    def _run(self, stage: str, model: Any, train_dl: Any, eval_dl: Any, datamodule: Any, ckpt_path: Any, **kw: Any) -> Any:
        from torchfleet.data import loaders_or_datamodule

        train_dl, datamodule = loaders_or_datamodule(train_dl, datamodule, stage)
        eval_dl, datamodule = loaders_or_datamodule(eval_dl, datamodule, stage)
        args.check_stage_args(stage, train_dl, eval_dl, datamodule, ckpt_path, kw)
        model = self._connect(stage, model, train_dl, eval_dl, datamodule)
        if stage == "fit" and self._auto_request is not None:  # before any process starts: by the model's memory
            from torchfleet.trainer.auto_strategy import choose_at_fit

            choose_at_fit(self, model, train_dl, datamodule)
        with runs.exported_run_id():  # the ranks it launches, and their restarts, continue this run
            return self._launch(stage, model, train_dl, eval_dl, ckpt_path, kw)

    def _launch(self, stage: str, model: Any, train_dl: Any, eval_dl: Any, ckpt_path: Any, kw: dict) -> Any:
        from torchfleet.trainer.stage import run_stage

        launcher = self.strategy.launcher
        if launcher is None or not launcher.runs_in_children:
            if launcher is None:
                return run_stage(self, stage, model, train_dl, eval_dl, ckpt_path, kw)
            return launcher.launch(run_stage, self, stage, model, train_dl, eval_dl, ckpt_path, kw)
        from torchfleet.trainer.spawned import restore, run_in_rank

        # the stage runs in child processes: this process's state says how it went
        self.state.status = TrainerStatus.RUNNING
        try:
            out = restore(self, model, launcher.launch(run_in_rank, self, stage, model, train_dl, eval_dl, ckpt_path, kw))
        except BaseException:
            self.state.status = TrainerStatus.INTERRUPTED
            raise
        self.state.status = TrainerStatus.FINISHED
        return out

    def _connect(self, stage: str, model: Any, train_dl: Any, eval_dl: Any, datamodule: Any) -> Any:
        from torchfleet.module import Module

        if model is None:
            if self.module is None:
                raise ConfigurationError(
                    f"trainer.{stage}() was called without a model, and this Trainer has not been given one before. "
                    f"Pass it: trainer.{stage}(model, ...)."
                )
            model = self.module
        from torchfleet.compiled import compile_methods_in_place

        model = compile_methods_in_place(model)  # torch.compile(model): the model inside, its steps compiled
        if not isinstance(model, Module):
            raise ConfigurationError(
                f"trainer.{stage}() needs a torchfleet.Module, got {type(model).__name__}. Subclass "
                "torchfleet.Module (a LightningModule ports by changing its import and base class), or use Fleet "
                "for a plain nn.Module in your own loop."
            )
        if datamodule is not None and (train_dl is not None or eval_dl is not None):
            raise ConfigurationError(
                f"trainer.{stage}() got both dataloaders and a datamodule. Pass one of them."
            )
        self.module = model
        self.datamodule = datamodule
        return model

    # ------------------------------------------------------------------ collectives
    _collective_label = "trainer"  # all_gather, all_reduce, broadcast, barrier: collectives.UserCollectives

    def _collective_strategy(self) -> Any:
        return self.strategy

    # ------------------------------------------------------------------ model creation
    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Create the model inside this block: on the strategy's device, in the precision's parameter dtype.

        With ``empty_init=True`` sharded strategies (fsdp) create the parameters on the meta device,
        without memory; ``fit`` then materialises only each process's shards and initialises them with
        the modules' ``reset_parameters()``, so a model larger than one process's memory can be built.
        """
        with self.strategy.tensor_init_context(empty_init):
            yield

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(
        self, filepath: str | os.PathLike, weights_only: bool = False, storage_options: Any = None
    ) -> None:
        """Write a checkpoint of the current run to ``filepath``. Every rank calls it; the strategy decides who writes."""
        from torchfleet.trainer.checkpointing import dump_checkpoint

        if self.module is None or self.state.wrapped is None:
            raise RuntimeError("trainer.save_checkpoint() needs a running fit/validate/test: there is no model set up yet.")
        checkpoint = dump_checkpoint(self, weights_only)
        self.strategy.save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        self.strategy.barrier("save_checkpoint")

