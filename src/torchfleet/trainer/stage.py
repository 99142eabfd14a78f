"""Running a stage (fit, validate, test, predict) in this process: setup, data, checkpoint restore, teardown.

The per-batch loops live in fit_loop.py and eval_loop.py.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from torchfleet.errors import ConfigurationError, MisconfiguredModuleError, PossibleUserWarning
from torchfleet.loggers.base import claim_versions
from torchfleet.module import Module
from torchfleet.samplers import without_shuffle
from torchfleet.seed import isolate_rng, reset_seed
from torchfleet.settings import loader_batch_size
from torchfleet.trainer.checkpointing import resolve_ckpt_path, restore_after_setup, restore_before_setup
from torchfleet.trainer.eval_loop import EvalLoop
from torchfleet.trainer.fit_loop import FitLoop
from torchfleet.trainer.loop_shape import agree_eval, agree_fit, has_length, val_every_fraction
from torchfleet.trainer.prediction_indices import prepare as prepare_prediction_indices
from torchfleet.trainer.preemption import FitPreemption
from torchfleet.trainer.profiling import attach as attach_profiler
from torchfleet.trainer.progress import trainer_loops
from torchfleet.trainer.stage_strategy import prepare_loader, setup_strategy, teardown_strategy
from torchfleet.utilities.combined_loader import BatchView, CombinedLoader

if TYPE_CHECKING:
    from torchfleet.trainer.loop_trainer import LoopTrainer

log = logging.getLogger("torchfleet")


def _source(trainer: LoopTrainer, model: Any, kind: str, given: Any) -> Any:
    if given is not None:
        return given
    name = f"{kind}_dataloader"
    for owner in (trainer.datamodule, model):
        fn = getattr(owner, name, None) if owner is not None else None
        if fn is not None:
            try:
                return fn()
            except NotImplementedError:
                if kind == "val" and owner is trainer.datamodule:
                    return None  # as Lightning: a datamodule without val_dataloader means no validation
                continue
    return None


def _one_or_list(loaders: list[Any]) -> Any:
    """What ``trainer.val_dataloaders`` and the like hold: None, the one loader, or the list of them."""
    return None if not loaders else loaders[0] if len(loaders) == 1 else loaders


def _as_list(loaders: Any) -> list[Any]:
    if loaders is None:
        return []
    if isinstance(loaders, CombinedLoader):
        # "sequential": each loader is a dataloader_idx of its own; another mode reads them together, as one loader
        return list(loaders.flattened) if loaders.mode == "sequential" else [loaders]
    if isinstance(loaders, (list, tuple)):
        return list(loaders)
    if isinstance(loaders, Mapping):
        return list(loaders.values())
    return [loaders]


def _num_batches(loader: Any, limit: int | float) -> int | float:
    n = len(loader) if has_length(loader) else float("inf")
    if isinstance(limit, float):
        if math.isinf(n):
            if limit not in (0.0, 1.0):
                raise ConfigurationError(
                    f"A fractional batch limit ({limit}) needs a dataloader with a length; this one has none. "
                    "Give the limit as a number of batches instead."
                )
            return 0 if limit == 0.0 else n
        return int(n * limit) if limit < 1.0 else n
    return min(n, limit)


# ---------------------------------------------------------------------------- entry
#: what cuBLAS needs for reproducible results under torch.use_deterministic_algorithms (else CUDA matmuls raise)
CUBLAS_DETERMINISTIC = ":4096:8"


def set_torch_flags(deterministic: bool | str | None, benchmark: bool | None) -> None:
    """Apply ``Trainer(deterministic=..., benchmark=...)`` to torch in this process.

    None leaves torch as it is; False turns deterministic algorithms off (a Trainer that ran with True earlier in
    the process left them on); True and "warn" turn them on (raising, or warning, where an operation has none)
    and give cuBLAS the workspace setting it needs for that, unless the environment already chose one.
    """
    if deterministic is not None:
        torch.use_deterministic_algorithms(bool(deterministic), warn_only=deterministic == "warn")
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)
    if benchmark is not None:
        torch.backends.cudnn.benchmark = benchmark


def run_stage(trainer: LoopTrainer, stage: str, model: Any, train_dl: Any, eval_dl: Any, ckpt_path: Any, kw: dict) -> Any:
    """Run one of fit/validate/test/predict in this process (called directly or by the launcher in each rank)."""
    # in each rank's process: anomaly mode is per thread, and spawned ranks start without it
    with torch.autograd.set_detect_anomaly(True) if trainer._detect_anomaly else contextlib.nullcontext():
        if stage == "fit":  # SIGTERM/SIGUSR1 save a checkpoint and stop (trainer/preemption.py)
            with FitPreemption(trainer):
                return _run_stage(trainer, stage, model, train_dl, eval_dl, ckpt_path, kw)
        return _run_stage(trainer, stage, model, train_dl, eval_dl, ckpt_path, kw)


def _run_stage(trainer: LoopTrainer, stage: str, model: Any, train_dl: Any, eval_dl: Any, ckpt_path: Any, kw: dict) -> Any:
    strategy = trainer.strategy
    trainer.state.start_stage(stage)
    model.trainer = trainer
    dm = trainer.datamodule
    if dm is not None:
        dm.trainer = trainer
    strategy.connect(model)  # first, as Lightning's Trainer: nothing is converted or moved yet
    failed = False
    end_profiling = None
    try:
        _prepare(trainer, stage, model)
        end_profiling = attach_profiler(trainer, stage)
        weights_only = kw.get("weights_only")  # None: the CheckpointIO's setting (safe unless it says otherwise)
        if stage == "fit":
            result = _fit(trainer, model, train_dl, eval_dl, ckpt_path, weights_only)
        elif stage == "predict":
            result = _predict(trainer, model, eval_dl, ckpt_path, kw.get("return_predictions", True), weights_only)
        else:
            result = _evaluate_stage(trainer, model, stage, eval_dl, ckpt_path, kw.get("verbose", True), weights_only)
        _end_stage(trainer, stage, model)
        return result
    except BaseException as exc:
        # Lightning's order: the callbacks', the DataModule's and the strategy's on_exception, the loggers, then the
        # strategy's teardown (sharded strategies leave the module sharded: the other ranks may be anywhere); the
        # stage-end hooks (on_fit_end, teardown) do not run. An error in those hooks comes here too (after the
        # stage's teardown: ModelCheckpoint(save_on_exception=True) still saves, and teardown runs again, as there)
        failed = True
        for cb in trainer.callbacks:
            cb.on_exception(trainer, model, exc)
        if dm is not None:
            dm.on_exception(exc)
        strategy.on_exception(exc)
        for lg in trainer.loggers if trainer.is_global_zero else []:
            lg.finalize("failed")
        teardown_strategy(trainer)
        if isinstance(exc, KeyboardInterrupt) and strategy.launcher is None:
            # as Lightning: the hooks above were the graceful shutdown, then the program ends with status 1 (a
            # launcher's ranks leave Ctrl-C to the launcher, which also interrupts rank 0 itself to stop it)
            log.info("Detected KeyboardInterrupt, attempting graceful shutdown ... (exit status 1)")
            raise SystemExit(1) from exc
        raise
    finally:
        strategy.precision.module_backward = None
        trainer._current_fx("")
        model.loop_door.results = None
        trainer.state.end_stage(failed)
        if end_profiling is not None:
            end_profiling()


def _prepare(trainer: LoopTrainer, stage: str, model: Any) -> None:
    """The rank's environment, prepare_data, the setup hooks and configure_model: what comes before the data."""
    strategy = trainer.strategy
    dm = trainer.datamodule
    if "trainer" in strategy.reseeds_for:
        reset_seed()
    strategy.setup_environment()
    set_torch_flags(trainer.deterministic, trainer.benchmark)  # in each rank's process (spawned ones too)
    for owner in (dm, model):  # as Lightning: both, each on local rank 0 of every machine or on global rank 0
        if owner is not None and (strategy.local_rank if owner.prepare_data_per_node else strategy.global_rank) == 0:
            owner.prepare_data()
    strategy.barrier("prepare_data")
    claim_versions(trainer.loggers, strategy)  # rank 0 creates the version folders: no other run takes them now
    if strategy.world_size > 1:
        # every rank names the same log and checkpoint folder: rank 0's (the only one that writes)
        for lg in trainer.loggers:
            lg.agree_version(strategy)
    if dm is not None:
        dm.setup(stage)
    extra = model.configure_callbacks()
    if extra:
        _merge_callbacks(trainer, extra)
    trainer._hooks.build(trainer.callbacks, model)
    if type(model).backward is not Module.backward:
        if strategy.backward_through_precision:
            strategy.precision.module_backward = model.backward
        elif trainer.is_global_zero:
            warnings.warn(f"{type(model).__name__} overrides backward(), which {type(strategy).__name__} does not "
                          "call: its engine runs the backward.", UserWarning, stacklevel=3)
    for cb in trainer.callbacks:
        cb.setup(trainer, model, stage)
    model.setup(stage)
    configure_model_once(trainer, model, lambda: _creation_contexts(strategy))


def _creation_contexts(strategy: Any) -> contextlib.ExitStack:
    """Lightning's contexts around ``configure_model``: ``tensor_init_context()``, ``model_sharded_context()`` inside,
    then the precision's ``module_init_context()``."""
    stack = contextlib.ExitStack()
    stack.enter_context(strategy.tensor_init_context())
    stack.enter_context(strategy.model_sharded_context())
    stack.enter_context(strategy.precision.module_init_context())
    return stack


def _end_stage(trainer: LoopTrainer, stage: str, model: Any) -> None:
    """A stage that returned: the strategy's teardown first (Lightning's order), then on_fit_end and the teardown hooks."""
    teardown_strategy(trainer)
    if stage == "fit":
        trainer._hooks.call("on_fit_end", trainer)
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.finalize("success")
        trainer.strategy.barrier("fit_end")
    for cb in trainer.callbacks:
        cb.teardown(trainer, model, stage)
    model.teardown(stage)
    if trainer.datamodule is not None:
        trainer.datamodule.teardown(stage)


def configure_model_once(trainer: LoopTrainer, model: Any, context: Any) -> None:
    """``configure_model()`` once per module and process, inside ``context()``: where the strategy creates models
    (meta under fsdp) in a rank; on the CPU in the process that spawned the ranks, before it takes their weights.
    ``context`` is a factory: creation contexts take effect when made (an ExitStack), so one is made only if used."""
    # Lightning's legacy configure_sharded_model first, as Lightning calls them
    hooks = [name for name in ("configure_sharded_model", "configure_model")
             if getattr(type(model), name, None) not in (None, getattr(Module, name))]
    door = model.loop_door
    if not hooks or door.configured:
        return
    if "configure_sharded_model" in hooks and trainer.is_global_zero:
        warnings.warn(f"{type(model).__name__} overrides configure_sharded_model, which Lightning deprecated: it "
                      "runs as configure_model does. Rename it to configure_model.", DeprecationWarning, stacklevel=2)
    previous = door.current_fx
    try:
        with context():
            for name in hooks:
                trainer._current_fx(name)
                getattr(model, name)()
    finally:
        trainer._current_fx(previous)
    door.configured = True


def _merge_callbacks(trainer: LoopTrainer, extra: Any) -> None:
    extra = list(extra) if isinstance(extra, (list, tuple)) else [extra]
    types = {type(c) for c in extra}
    # a callback type the model configures replaces the Trainer's of the same type, as in Lightning
    trainer.callbacks = [c for c in trainer.callbacks if type(c) not in types] + extra


def _log_summary(trainer: LoopTrainer, model: Any) -> None:
    from torchfleet.trainer.callbacks.model_summary import ModelSummary

    # a ModelSummary among the callbacks logs its own table when fit starts
    if trainer.enable_model_summary and not any(isinstance(c, ModelSummary) for c in trainer.callbacks):
        ModelSummary(max_depth=1).on_fit_start(trainer, model)


def _each_loader(loader: Any, fn: Any, *args: Any) -> Any:
    """``fn(loader, *args)``; for a CombinedLoader, ``fn`` replaces each of its loaders and the CombinedLoader stays."""
    if isinstance(loader, CombinedLoader):
        loader.flattened = [fn(one, *args) for one in loader.flattened]
        return loader
    return fn(loader, *args)


def _for_strategy(trainer: LoopTrainer, loader: Any, stage: str) -> Any:
    if isinstance(loader, CombinedLoader):  # each of its loaders is prepared; the loops read its combined batches
        return BatchView(_each_loader(loader, lambda one: _for_strategy(trainer, one, stage)))
    return prepare_loader(trainer, loader, stage)


# ---------------------------------------------------------------------------- fit
def _check_training_step_signature(model: Any) -> None:
    """Lightning 1.x multi-optimizer modules take ``optimizer_idx``; Lightning 2 (and torchfleet) never pass it."""
    try:
        params = inspect.signature(model.training_step).parameters
    except (TypeError, ValueError):
        return
    if "optimizer_idx" in params:
        raise MisconfiguredModuleError(
            f"{type(model).__name__}.training_step takes an `optimizer_idx` argument: that is Lightning 1.x "
            "multi-optimizer style, which Lightning 2 removed and torchfleet does not support. Port it to manual "
            "optimisation: set self.automatic_optimization = False in __init__, remove `optimizer_idx` from "
            "training_step, get the optimizers with `opt_g, opt_d = self.optimizers()`, and for each one call "
            "self.toggle_optimizer(opt), opt.zero_grad(), self.manual_backward(loss), opt.step(), "
            "self.untoggle_optimizer(opt)."
        )


def _defines_step(model: Any, name: str) -> bool:
    """Whether the model defines ``name`` (set to None, as Lightning allows, on its class or on the instance:
    ``model.validation_step = None``, it disables that loop)."""
    if name in vars(model):
        return vars(model)[name] is not None
    impl = getattr(type(model), name, None)
    return impl is not None and impl is not getattr(Module, name)


def _fit_sources(trainer: LoopTrainer, model: Any, train_dl: Any, val_dl: Any) -> tuple[Any, list[Any]]:
    """The training data (several loaders combined) and the validation loaders, asked for as Lightning does:
    ``val_dataloader()`` only when validation runs, first and inside ``isolate_rng`` when the sanity check will
    run (there Lightning calls it), then ``train_dataloader()``; so data the hooks draw from the global
    generator are Lightning's."""
    checked = _defines_step(model, "validation_step") and trainer.num_sanity_val_steps and trainer.limit_val_batches
    with isolate_rng() if checked else contextlib.nullcontext():
        val_source = _as_list(_source(trainer, model, "val", val_dl)) if trainer.limit_val_batches else []
    train_loader = _train_source(trainer, model, train_dl)
    if val_source and not _defines_step(model, "validation_step"):
        if getattr(model, "validation_step", None) is not None and trainer.is_global_zero:
            warnings.warn(f"fit got validation data but {type(model).__name__} defines no validation_step: "
                          "validation is skipped.", UserWarning, stacklevel=2)
        val_source = []  # validation_step = None: validation is switched off, as in Lightning
    return train_loader, val_source


def _train_source(trainer: LoopTrainer, model: Any, train_dl: Any) -> Any:
    """The training data, several loaders combined; refused where there are none or they cannot train."""
    train_loader = _source(trainer, model, "train", train_dl)
    if train_loader is None:
        raise ConfigurationError(
            "trainer.fit() found no training data: pass train_dataloaders=..., a datamodule with "
            "train_dataloader(), or define train_dataloader() on the model."
        )
    if isinstance(train_loader, (Mapping, list, tuple)):  # several loaders: one batch of each per step, as Lightning
        train_loader = CombinedLoader(train_loader, "max_size_cycle")
    if isinstance(train_loader, CombinedLoader) and train_loader.mode == "sequential":
        raise ConfigurationError(
            'trainer.fit() cannot train on a CombinedLoader(mode="sequential"): a training step takes one batch of '
            'every loader. Use mode "max_size_cycle" (the default for a list or dict of loaders), "max_size" or '
            '"min_size".'
        )
    return train_loader


def _prepared(trainer: LoopTrainer, loader: Any, stage: str) -> Any:
    """A fit loader as the loops read it: unshuffled under overfit_batches, then the strategy's (its sampler)."""
    if trainer.overfit_batches:
        loader = _each_loader(loader, without_shuffle, "train" if stage == "fit" else "val")
    return _for_strategy(trainer, loader, stage)


def _reloader(trainer: LoopTrainer, model: Any, train_dl: Any, val_dl: Any) -> Any:
    """For ``reload_dataloaders_every_n_epochs``: ``reload(loop, kind)`` gives the fit loop the training loader (at an
    epoch's start) or the validation loaders (before validating) anew when that many epochs passed since they were
    last asked for, as Lightning, their batch counts agreed again; ``kind=None`` marks the loaders fit started with."""
    every, strategy, asked_at = trainer.reload_dataloaders_every_n_epochs, trainer.strategy, {}

    def reload(loop: FitLoop, kind: str | None) -> None:
        epoch = trainer.state.current_epoch
        if kind is None:
            asked_at.update(train=epoch, val=epoch)
            return
        if epoch - asked_at[kind] < every:
            return
        asked_at[kind] = epoch
        if kind == "val":
            loop.val_loaders = [_prepared(trainer, v, "validate") for v in _as_list(_source(trainer, model, "val", val_dl))]
            trainer.num_val_batches = agree_eval(
                strategy, [_num_batches(v, trainer.limit_val_batches) for v in loop.val_loaders])
            trainer.val_dataloaders = _one_or_list(loop.val_loaders)
            return
        loop.loader = loader = _prepared(trainer, _train_source(trainer, model, train_dl), "fit")
        shape = agree_fit(strategy, _num_batches(loader, trainer.limit_train_batches), has_length(loader), [])
        trainer.num_training_batches, loop._lockstep = shape.train_batches, shape.lockstep
        loop._look_ahead = shape.lockstep or not has_length(loader)
        trainer.train_dataloader = loader.combined.iterables if isinstance(loader, BatchView) else loader
        if loop._val_seconds is None and isinstance(trainer.val_check_interval, float):  # the epoch's length changed
            loop.val_every = val_every_fraction(shape.train_batches, trainer.val_check_interval)

    return reload if every else None


def _fit(trainer: LoopTrainer, model: Any, train_dl: Any, val_dl: Any, ckpt_path: Any, weights_only: bool | None) -> None:
    strategy = trainer.strategy
    _check_training_step_signature(model)
    train_loader, val_source = _fit_sources(trainer, model, train_dl, val_dl)
    if trainer._max_epochs_defaulted and trainer.is_global_zero:
        # Lightning's words first, and its category (a UserWarning), for filters written against it
        warnings.warn(f"`max_epochs` was not set. Setting it to {trainer.max_epochs} epochs: fit stops after "
                      f"{trainer.max_epochs} epochs. Pass max_epochs=N, or max_epochs=-1 to train until max_steps, "
                      "max_time or a callback stops it.", PossibleUserWarning, stacklevel=2)
    micro_batch_size = loader_batch_size(train_loader)
    path = resolve_ckpt_path(trainer, ckpt_path, "fit")
    trainer.ckpt_path = path
    checkpoint = restore_before_setup(trainer, path, full=True, weights_only=weights_only)
    # the loaders are prepared before setup (Lightning: as its loops start), so that configure_optimizers can read
    # estimated_stepping_batches; validation's first, as Lightning asks the strategy
    val_loaders = [_prepared(trainer, v, "validate") for v in val_source]
    train_loader = _prepared(trainer, train_loader, "fit")
    # every rank runs the same number of training and validation batches (loop_shape.py): one collective
    shape = agree_fit(strategy, _num_batches(train_loader, trainer.limit_train_batches), has_length(train_loader),
                      [_num_batches(v, trainer.limit_val_batches) for v in val_loaders])
    trainer.num_training_batches, trainer.num_val_batches = shape.train_batches, shape.val_batches
    # a CombinedLoader shows its collection of loaders, as in Lightning
    trainer.train_dataloader = train_loader.combined.iterables if isinstance(train_loader, BatchView) else train_loader
    trainer.val_dataloaders = _one_or_list(val_loaders)
    trainer.state.current_epoch = 0
    trainer.state.global_step = 0
    setup_strategy(trainer, model, "fit", micro_batch_size=micro_batch_size)
    _log_summary(trainer, model)
    hparams = _hparams_to_log(model, trainer.datamodule) if trainer.is_global_zero and trainer.loggers else None
    for lg in trainer.loggers if trainer.is_global_zero else []:
        if hparams is not None:
            lg.log_hyperparams(hparams)
        graph = getattr(lg, "log_graph", None)  # as Lightning (TensorBoardLogger(log_graph=True)); yours may lack it
        if callable(graph) and trainer.strategy.outside_forward != "never":  # a sharded forward on rank 0 alone hangs
            graph(model)
    trainer._hooks.call("on_fit_start", trainer)
    restore_after_setup(trainer, path, checkpoint, full=True, weights_only=weights_only)
    if trainer.num_sanity_val_steps and val_loaders and trainer.limit_val_batches:
        with isolate_rng():  # as in Lightning: training draws the same numbers with and without the check
            _sanity_check(trainer, model, val_loaders)
    loop = FitLoop(trainer, model, train_loader, val_loaders, lockstep=shape.lockstep,
                   reload=_reloader(trainer, model, train_dl, val_dl))
    # fit validates through trainer.fit_loop.epoch_loop.val_loop.run() (a callback or test may replace it)
    loop._val_loop._runner = loop._run_validation
    try:
        loop.run()
    finally:
        loop._val_loop._runner = None


def _hparams_to_log(model: Any, dm: Any) -> dict[str, Any] | None:
    """The Module's and the DataModule's saved hyperparameters; None when both saved theirs with ``logger=False``
    (then, as in Lightning, the loggers are not called)."""
    dm_logs = dm is not None and getattr(dm, "logs_hparams", False)
    if not (model.logs_hparams or dm_logs):
        return None
    out = dict(model.hparams) if model.logs_hparams else {}
    if dm_logs:
        theirs = dict(getattr(dm, "hparams", {}))
        clash = sorted(k for k in theirs.keys() & out.keys() if theirs[k] != out[k])
        if clash:
            raise ConfigurationError(
                f"The Module and the DataModule both saved hyperparameters named {', '.join(map(repr, clash))} with "
                "different values, so the loggers cannot record both. Rename one, or pass ignore=[...] (or "
                "logger=False) to one of the save_hyperparameters() calls."
            )
        out.update(theirs)
    return out


def _sanity_check(trainer: LoopTrainer, model: Any, val_loaders: list[Any]) -> None:
    trainer.state.sanity_checking = True
    n = trainer.num_sanity_val_steps
    limits = [b if n == -1 else min(n, b) for b in trainer.num_val_batches]
    trainer.num_sanity_val_batches = limits
    trainer._hooks.call("on_sanity_check_start", trainer)
    EvalLoop(trainer, model, "sanity_check", val_loaders, limits).run()
    trainer._hooks.call("on_sanity_check_end", trainer)
    trainer.state.sanity_checking = False
    trainer.state.epoch_metrics.clear()
    trainer.state.bar_metrics.clear()


def _evaluate_stage(trainer: LoopTrainer, model: Any, stage: str, dl: Any, ckpt_path: Any, verbose: bool,
                    weights_only: bool | None) -> list[dict[str, float]]:
    kind = "val" if stage == "validate" else "test"
    step = "validation_step" if stage == "validate" else "test_step"
    if getattr(model, step, None) is None:
        raise MisconfiguredModuleError(
            f"trainer.{stage}() needs {type(model).__name__}.{step}, which is set to None. Define "
            f"{step}(self, batch, batch_idx) to {stage} the model."
        )
    loaders = [_for_strategy(trainer, v, stage) for v in _as_list(_source(trainer, model, kind, dl))]
    if not loaders:
        raise ConfigurationError(
            f"trainer.{stage}() found no data: pass dataloaders=..., a datamodule with {kind}_dataloader(), or "
            f"define {kind}_dataloader() on the model."
        )
    limit = trainer.limit_val_batches if stage == "validate" else trainer.limit_test_batches
    limits = agree_eval(trainer.strategy, [_num_batches(v, limit) for v in loaders])
    if stage == "validate":
        trainer.num_val_batches, trainer.val_dataloaders = limits, _one_or_list(loaders)
    else:
        trainer.num_test_batches, trainer.test_dataloaders = limits, _one_or_list(loaders)
    _setup_for_evaluation(trainer, model, stage, ckpt_path, weights_only)
    trainer.state.epoch_metrics.clear()
    results = EvalLoop(trainer, model, stage, loaders, limits).run()
    if verbose and trainer.is_global_zero and results:
        for i, metrics in enumerate(results):
            if metrics:
                body = "\n".join(f"  {k:<30} {v:.6g}" for k, v in sorted(metrics.items()))
                log.info("%s metrics%s:\n%s", stage.capitalize(), f" (dataloader {i})" if len(results) > 1 else "", body)
    if trainer.is_global_zero:
        for lg in trainer.loggers:
            lg.save()
    return results


def _predict(trainer: LoopTrainer, model: Any, dl: Any, ckpt_path: Any, return_predictions: bool,
             weights_only: bool | None) -> Any:
    sources = _as_list(_source(trainer, model, "predict", dl))
    if any(isinstance(v, CombinedLoader) for v in sources):
        raise ConfigurationError(
            'trainer.predict() takes a CombinedLoader only in mode "sequential" (each loader\'s batches in turn, with '
            'their dataloader_idx), as Lightning does: build it with CombinedLoader(loaders, "sequential").'
        )
    loaders, indices = prepare_prediction_indices(trainer, trainer_loops(trainer)["predict"],
                                                  [_for_strategy(trainer, v, "predict") for v in sources])
    if not loaders:
        raise ConfigurationError(
            "trainer.predict() found no data: pass dataloaders=..., a datamodule with predict_dataloader(), or "
            "define predict_dataloader() on the model."
        )
    limits = agree_eval(trainer.strategy, [_num_batches(v, trainer.limit_predict_batches) for v in loaders])
    trainer.num_predict_batches, trainer.predict_dataloaders = limits, _one_or_list(loaders)
    _setup_for_evaluation(trainer, model, "predict", ckpt_path, weights_only)
    loop = EvalLoop(trainer, model, "predict", loaders, limits,
                    collect=return_predictions or (indices is not None and indices.on_epoch), indices=indices)
    loop.run()
    if indices is not None:
        indices.finish(return_predictions)
    if not return_predictions:
        return None
    return loop.predictions[0] if len(loop.predictions) == 1 else loop.predictions


def _setup_for_evaluation(trainer: LoopTrainer, model: Any, stage: str, ckpt_path: Any, weights_only: bool | None) -> None:
    """validate/test/predict: the module restored from ``ckpt_path`` before or after ``setup(trainer)``, as the
    strategy's ``restore_checkpoint_after_setup`` says."""
    path = resolve_ckpt_path(trainer, ckpt_path, stage)
    checkpoint = restore_before_setup(trainer, path, full=False, weights_only=weights_only)
    setup_strategy(trainer, model, stage)
    restore_after_setup(trainer, path, checkpoint, full=False, weights_only=weights_only)
