"""The fit, evaluation and predict loops. Strategy-agnostic: everything device- or process-specific
goes through ``trainer.strategy``."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from torchfleet.errors import ConfigurationError, MisconfiguredModuleError
from torchfleet.trainer.checkpointing import capture_rng, resolve_ckpt_path, restore, restore_rng
from torchfleet.trainer.logging import Results
from torchfleet.trainer.optim import parse_optimizers

if TYPE_CHECKING:
    from torchfleet.trainer.trainer import Trainer

log = logging.getLogger("torchfleet")

_STEP_NAME = {"validate": "validation_step", "test": "test_step", "sanity_check": "validation_step", "predict": "predict_step"}
_HOOK_STAGE = {"validate": "validation", "sanity_check": "validation", "test": "test", "predict": "predict"}


# ---------------------------------------------------------------------------- dataloaders
def _source(trainer: Trainer, model: Any, kind: str, given: Any) -> Any:
    if given is not None:
        return given
    name = f"{kind}_dataloader"
    for owner in (trainer.datamodule, model):
        fn = getattr(owner, name, None) if owner is not None else None
        if fn is not None:
            try:
                return fn()
            except NotImplementedError:
                continue
    return None


def _as_list(loaders: Any) -> list[Any]:
    if loaders is None:
        return []
    if isinstance(loaders, (list, tuple)):
        return list(loaders)
    if isinstance(loaders, Mapping):
        return list(loaders.values())
    return [loaders]


def _num_batches(loader: Any, limit: int | float) -> int | float:
    try:
        n = len(loader)
    except TypeError:
        n = float("inf")
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
def run_stage(trainer: Trainer, stage: str, model: Any, train_dl: Any, eval_dl: Any, ckpt_path: Any, kw: dict) -> Any:
    """Run one of fit/validate/test/predict in this process (called directly or by the launcher in each rank)."""
    strategy = trainer.strategy
    trainer.stage = stage
    trainer.should_stop = False
    trainer._resume = None
    trainer._progress = None
    strategy.setup_environment()
    if trainer.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=trainer.deterministic == "warn")
        torch.backends.cudnn.benchmark = False
    model.trainer = trainer
    dm = trainer.datamodule
    if dm is not None:
        dm.trainer = trainer
    if strategy.local_rank == 0:
        (dm if dm is not None else model).prepare_data()
    strategy.barrier("prepare_data")
    if dm is not None:
        dm.setup(stage)
    extra = model.configure_callbacks()
    if extra:
        _merge_callbacks(trainer, extra)
    trainer._hooks.build(trainer.callbacks, model)
    for cb in trainer.callbacks:
        cb.setup(trainer, model, stage)
    model.setup(stage)
    try:
        if stage == "fit":
            return _fit(trainer, model, train_dl, eval_dl, ckpt_path)
        if stage == "predict":
            return _predict(trainer, model, eval_dl, ckpt_path, kw.get("return_predictions", True))
        return _evaluate_stage(trainer, model, stage, eval_dl, ckpt_path, kw.get("verbose", True))
    except BaseException as exc:
        for cb in trainer.callbacks:
            cb.on_exception(trainer, model, exc)
        for lg in trainer.loggers if trainer.is_global_zero else []:
            lg.finalize("failed")
        raise
    finally:
        for cb in trainer.callbacks:
            cb.teardown(trainer, model, stage)
        model.teardown(stage)
        if dm is not None:
            dm.teardown(stage)
        strategy.checkpoint_io.teardown()
        trainer._current_fx("")
        model._results = None
        trainer.stage = None


def _merge_callbacks(trainer: Trainer, extra: Any) -> None:
    extra = list(extra) if isinstance(extra, (list, tuple)) else [extra]
    types = {type(c) for c in extra}
    # a callback type the model configures replaces the Trainer's of the same type, as in Lightning
    trainer.callbacks = [c for c in trainer.callbacks if type(c) not in types] + extra


def _setup_model(trainer: Trainer, model: Any, with_optimizers: bool) -> None:
    strategy = trainer.strategy
    opts, scheds = [], []
    if with_optimizers:
        opts, scheds = parse_optimizers(model.configure_optimizers())
        if not opts:
            log.warning("configure_optimizers() returned None: fit runs forward and backward but changes no weights.")
        if model.automatic_optimization and len(opts) > 1:
            raise MisconfiguredModuleError(
                f"configure_optimizers() returned {len(opts)} optimizers, but automatic optimisation steps one. "
                "Set self.automatic_optimization = False and step them yourself in training_step "
                "(self.optimizers(), self.manual_backward(loss)), or combine the parameter groups in one optimizer."
            )
    wrapped, opts = strategy.setup(model, opts)
    trainer._wrapped = wrapped
    trainer.optimizers = opts
    trainer.lr_scheduler_configs = scheds
    trainer._manual_optimizers = None


def _log_summary(trainer: Trainer, model: Any) -> None:
    if not (trainer.enable_model_summary and trainer.is_global_zero):
        return
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    rows = [(name, type(child).__name__, sum(p.numel() for p in child.parameters())) for name, child in model.named_children()]
    width = max([len(r[0]) for r in rows] + [4])
    lines = [f"  {'Name':<{width}}  {'Type':<24} {'Params':>12}"]
    lines += [f"  {n:<{width}}  {t:<24} {p:>12,}" for n, t, p in rows]
    lines.append(f"  {trainable:,} trainable, {total - trainable:,} frozen, {total:,} total parameters")
    log.info("%s on %s, %s, precision %s:\n%s", type(model).__name__, trainer.strategy.root_device,
             type(trainer.strategy).__name__, trainer.precision, "\n".join(lines))


# ---------------------------------------------------------------------------- fit
def _fit(trainer: Trainer, model: Any, train_dl: Any, val_dl: Any, ckpt_path: Any) -> None:
    strategy = trainer.strategy
    train_loader = _source(trainer, model, "train", train_dl)
    if train_loader is None:
        raise ConfigurationError(
            "trainer.fit() found no training data: pass train_dataloaders=..., a datamodule with "
            "train_dataloader(), or define train_dataloader() on the model."
        )
    train_loader = strategy.process_dataloader(train_loader, "fit")
    val_loaders = [strategy.process_dataloader(v, "validate") for v in _as_list(_source(trainer, model, "val", val_dl))]
    trainer.num_training_batches = _num_batches(train_loader, trainer.limit_train_batches)
    trainer.num_val_batches = [_num_batches(v, trainer.limit_val_batches) for v in val_loaders]
    trainer.current_epoch = 0
    trainer.global_step = 0
    _setup_model(trainer, model, with_optimizers=True)
    path = resolve_ckpt_path(trainer, ckpt_path, "fit")
    trainer.ckpt_path = path
    if path is not None:
        restore(trainer, path, full=True)
    _log_summary(trainer, model)
    if trainer.is_global_zero:
        for lg in trainer.loggers:
            lg.log_hyperparams(dict(model.hparams))
    trainer._hooks.call("on_fit_start", trainer)
    if trainer.num_sanity_val_steps and val_loaders and trainer.limit_val_batches:
        _sanity_check(trainer, model, val_loaders)
    FitLoop(trainer, model, train_loader, val_loaders).run()
    trainer._hooks.call("on_fit_end", trainer)
    if trainer.is_global_zero:
        for lg in trainer.loggers:
            lg.finalize("success")
    strategy.barrier("fit_end")


def _sanity_check(trainer: Trainer, model: Any, val_loaders: list[Any]) -> None:
    trainer.sanity_checking = True
    n = trainer.num_sanity_val_steps
    limits = [b if n == -1 else min(n, b) for b in trainer.num_val_batches]
    trainer._hooks.call("on_sanity_check_start", trainer)
    EvalLoop(trainer, model, "sanity_check", val_loaders, limits).run()
    trainer._hooks.call("on_sanity_check_end", trainer)
    trainer.sanity_checking = False
    trainer._epoch_metrics.clear()
    trainer._bar_metrics.clear()


def _needs_closure(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` must get the closure: it re-evaluates the loss (LBFGS) or is not torch's.

    torch's other optimizers call a closure once, before the update, which would only return the loss
    already computed; skipping it saves the closure's enable_grad bookkeeping on every step.
    """
    cls = type(optimizer)
    return cls.__module__.split(".")[:2] != ["torch", "optim"] or isinstance(optimizer, torch.optim.LBFGS)


class _ReplayClosure:
    """Returns the already computed loss on the first call; recomputes forward+backward on later calls (LBFGS)."""

    __slots__ = ("loss", "recompute", "used")

    def __init__(self, loss: Any, recompute: Any) -> None:
        self.loss, self.recompute, self.used = loss, recompute, False

    def __call__(self) -> Any:
        if not self.used:
            self.used = True
            return self.loss
        return self.recompute()


class FitLoop:
    """Epochs of training batches, with validation, logging, checkpoint callbacks and exact resume."""

    def __init__(self, trainer: Trainer, model: Any, train_loader: Any, val_loaders: list[Any]) -> None:
        self.trainer = trainer
        self.model = model
        self.loader = train_loader
        self.val_loaders = val_loaders
        self.strategy = trainer.strategy
        n = trainer.num_training_batches
        interval = trainer.val_check_interval
        if isinstance(interval, float):
            self.val_every = n if math.isinf(n) or interval == 1.0 else max(1, int(n * interval))
        else:
            if not math.isinf(n) and interval > n:
                raise ConfigurationError(
                    f"val_check_interval={interval} is larger than the number of training batches per epoch ({n}). "
                    "Use a value <= the epoch length, or a float fraction."
                )
            self.val_every = interval
        # which optional hooks exist, decided once: the per-step path then costs nothing for the rest
        hooks = trainer._hooks

        def present(name: str) -> bool:
            return bool(hooks.cb(name)) or hooks.mod(name) is not None

        self._has_before_backward = present("on_before_backward")
        self._has_after_backward = present("on_after_backward")
        self._has_before_step = present("on_before_optimizer_step")
        self._has_before_zero_grad = present("on_before_zero_grad")
        self._custom_clipping = hooks.mod("configure_gradient_clipping")
        self._custom_zero_grad = hooks.mod("optimizer_zero_grad")
        self._closure = _ReplayClosure(None, None)
        self._closure_needed = bool(trainer.optimizers) and _needs_closure(trainer.optimizers[0])
        self._forward_context = self.strategy.forward_context
        self._has_step_schedulers = any(c.interval == "step" for c in trainer.lr_scheduler_configs)

    # -- progress, saved in checkpoints as loops["fit"] ----------------------------------------
    def _set_progress(self, **kw: Any) -> None:
        self.trainer._progress.update(kw)

    def run(self) -> None:
        trainer = self.trainer
        resume = trainer._resume or {}
        progress = resume.get("loops") or None
        trainer._progress = {"epoch": trainer.current_epoch, "batches_done": 0, "epoch_done": False,
                             "val_pending": False, "epoch_start_rng": None}
        start_batch, mid_epoch = 0, None
        if progress is not None:
            if progress["epoch_done"]:
                trainer.current_epoch = progress["epoch"] + 1
                if resume.get("rng") is not None:
                    restore_rng(resume["rng"])
            else:
                trainer.current_epoch = progress["epoch"]
                start_batch, mid_epoch = progress["batches_done"], progress
        trainer._hooks.call("on_train_start", trainer)
        while not self._done():
            if mid_epoch is not None:
                self.run_epoch(start_batch, mid_epoch, resume.get("rng"))
                mid_epoch = None
            else:
                self.run_epoch(0, None, None)
            if trainer.should_stop and self._may_stop():
                break
            trainer.current_epoch += 1
        trainer._hooks.call("on_train_end", trainer)

    def _done(self) -> bool:
        t = self.trainer
        if t.max_steps != -1 and t.global_step >= t.max_steps:
            return True
        return t.max_epochs != -1 and t.current_epoch >= t.max_epochs

    def _may_stop(self) -> bool:
        t = self.trainer
        return t.current_epoch + 1 >= t.min_epochs and t.global_step >= t.min_steps

    def run_epoch(self, start_batch: int, resume_at: dict | None, rng: dict | None) -> None:
        trainer, strategy, model, hooks = self.trainer, self.strategy, self.model, self.trainer._hooks
        sampler = getattr(self.loader, "sampler", None)
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(trainer.current_epoch)
        # The iterator's shuffle order and worker seeds come from the global RNG when it is created:
        # remember that state so a resumed run recreates the same order.
        if resume_at is not None and resume_at.get("epoch_start_rng") is not None:
            restore_rng(resume_at["epoch_start_rng"])
        epoch_start_rng = capture_rng()
        self._set_progress(epoch=trainer.current_epoch, batches_done=start_batch, epoch_done=False,
                           val_pending=False, epoch_start_rng=epoch_start_rng)
        results = Results("train")
        results.device = strategy.root_device
        trainer._train_results = results
        model._results = results
        model.train()
        trainer._in_train = True
        hooks.call("on_train_epoch_start", trainer)
        iterator = iter(self.loader)
        for _ in range(start_batch):  # fast-forward to where the interrupted run stopped
            next(iterator, None)
        if rng is not None:
            restore_rng(rng)
        if resume_at is not None and resume_at.get("val_pending"):
            self._validate()

        limit = trainer.num_training_batches
        accumulate = trainer.accumulate_grad_batches
        log_every = trainer.log_every_n_steps
        automatic = model.automatic_optimization
        opt = trainer.optimizers[0] if trainer.optimizers else None
        step_fn = strategy.step_function(trainer._wrapped, "training_step")
        batch_start_cbs = hooks.cb("on_train_batch_start")
        batch_start_mod = hooks.mod("on_train_batch_start")
        batch_end_cbs = hooks.cb("on_train_batch_end")
        batch_end_mod = hooks.mod("on_train_batch_end")
        transfer = self._transfer_fn()
        progress = trainer._progress
        trainer._current_fx("training_step")
        window_has_grads = False
        for batch_idx, batch in enumerate(iterator, start_batch):
            if batch_idx >= limit:
                break
            is_last = batch_idx + 1 >= limit
            batch = transfer(batch)
            results.new_batch(batch)
            skip_rest = False
            for fn in batch_start_cbs:
                fn(trainer, model, batch, batch_idx)
            if batch_start_mod is not None:
                skip_rest = hooks.call_module(trainer, "on_train_batch_start", batch_start_mod, batch, batch_idx) == -1
            if skip_rest:
                break
            if automatic:
                boundary = (batch_idx + 1) % accumulate == 0 or is_last
                loss = self._forward_backward(step_fn, batch, batch_idx, accumulate, boundary)
                window_has_grads = window_has_grads or loss is not None
                if boundary:
                    if window_has_grads and opt is not None:
                        self._optimizer_step(opt, loss, step_fn, batch, batch_idx)
                    window_has_grads = False
                    outputs = loss
                else:
                    outputs = loss
            else:
                outputs = step_fn(batch, batch_idx)
                boundary = True
            progress["batches_done"] = batch_idx + 1
            validate_now = self._should_validate(batch_idx, is_last)
            progress["val_pending"] = validate_now
            if boundary and trainer.global_step % log_every == 0 and trainer.global_step > 0 and (
                automatic or outputs is not None
            ):
                self._log_step(results)
            for fn in batch_end_cbs:
                fn(trainer, model, outputs, batch, batch_idx)
            if batch_end_mod is not None:
                hooks.call_module(trainer, "on_train_batch_end", batch_end_mod, outputs, batch, batch_idx)
            if validate_now:
                self._validate()
            if trainer.should_stop and self._may_stop():
                break
            if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
                break
        del iterator
        # epoch end: ordinary callbacks and the Module, then epoch metrics and epoch schedulers,
        # then ModelCheckpoint/EarlyStopping, which see all of that.
        model._results = results

        def finish_epoch() -> None:
            self._log_epoch(results)
            self._step_schedulers("epoch")
            self._set_progress(epoch_done=True, val_pending=False)

        hooks.call_module_between("on_train_epoch_end", trainer, between=finish_epoch)
        model._results = None

    def _transfer_fn(self) -> Any:
        trainer, strategy, hooks = self.trainer, self.strategy, self.trainer._hooks
        before = hooks.mod("on_before_batch_transfer")
        custom = hooks.mod("transfer_batch_to_device")
        after = hooks.mod("on_after_batch_transfer")
        dm = trainer.datamodule
        if before is None and custom is None and after is None and dm is None:
            return strategy.batch_to_device
        device = strategy.root_device

        def transfer(batch: Any) -> Any:
            if dm is not None:
                batch = dm.on_before_batch_transfer(batch, 0)
            if before is not None:
                batch = before(batch, 0)
            batch = custom(batch, device, 0) if custom is not None else strategy.batch_to_device(batch)
            if custom is not None:
                batch = strategy.precision.convert_input(batch)
            if dm is not None:
                batch = dm.on_after_batch_transfer(batch, 0)
            if after is not None:
                batch = after(batch, 0)
            return batch

        return transfer

    def _forward_backward(self, step_fn: Any, batch: Any, batch_idx: int, accumulate: int, boundary: bool) -> Tensor | None:
        trainer, strategy = self.trainer, self.strategy
        with self._forward_context():
            output = step_fn(batch, batch_idx)
        loss = _extract_loss(output)
        if loss is None:
            return None
        hooks = trainer._hooks
        scaled = loss / accumulate if accumulate > 1 else loss
        if self._has_before_backward:
            hooks.call("on_before_backward", trainer, scaled)
        if boundary:
            strategy.backward(scaled, trainer._wrapped)
        else:
            with strategy.no_backward_sync(trainer._wrapped):
                strategy.backward(scaled, trainer._wrapped)
        if self._has_after_backward:
            hooks.call("on_after_backward", trainer)
        return loss.detach()

    def _optimizer_step(self, opt: Any, loss: Tensor | None, step_fn: Any, batch: Any, batch_idx: int) -> None:
        trainer, strategy, model, hooks = self.trainer, self.strategy, self.model, self.trainer._hooks
        if self._has_before_step:
            hooks.call("on_before_optimizer_step", trainer, opt)
        clip = self._custom_clipping
        if clip is not None:
            clip(opt, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
        elif trainer.gradient_clip_val:
            model.clip_gradients(opt, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)

        if self._closure_needed:
            def recompute() -> Any:
                opt.zero_grad(set_to_none=True)
                return self._forward_backward(step_fn, batch, batch_idx, 1, True)

            closure = self._closure
            closure.loss, closure.recompute, closure.used = loss, recompute, False
            strategy.optimizer_step(opt, closure)
        else:
            strategy.optimizer_step(opt)
        if self._has_before_zero_grad:
            hooks.call("on_before_zero_grad", trainer, opt)
        zero = self._custom_zero_grad
        if zero is not None:
            zero(trainer.current_epoch, batch_idx, opt)
        else:
            opt.zero_grad(set_to_none=True)
        trainer.global_step += 1
        if self._has_step_schedulers:
            self._step_schedulers("step")

    def _step_schedulers(self, interval: str) -> None:
        trainer = self.trainer
        count = trainer.global_step if interval == "step" else trainer.current_epoch + 1
        for config in trainer.lr_scheduler_configs:
            if config.interval != interval or count % config.frequency:
                continue
            if config.reduce_on_plateau:
                metrics = trainer.callback_metrics
                if config.monitor not in metrics:
                    if config.strict:
                        raise MisconfiguredModuleError(
                            f"The ReduceLROnPlateau scheduler watches {config.monitor!r}, which was not logged. "
                            f"Logged metrics: {', '.join(sorted(metrics)) or 'none'}. Log it with self.log, or "
                            "pass 'strict': False in the lr_scheduler dict to skip such steps."
                        )
                    continue
                config.scheduler.step(float(metrics[config.monitor]))
            else:
                config.scheduler.step()

    def _should_validate(self, batch_idx: int, is_last: bool) -> bool:
        trainer = self.trainer
        if not self.val_loaders or not any(trainer.num_val_batches):
            return False
        if (trainer.current_epoch + 1) % trainer.check_val_every_n_epoch:
            return False
        if isinstance(trainer.val_check_interval, float) and trainer.val_check_interval == 1.0:
            return is_last
        return (batch_idx + 1) % self.val_every == 0

    def _validate(self) -> None:
        trainer = self.trainer
        trainer._in_train = False
        EvalLoop(trainer, self.model, "validate", self.val_loaders, trainer.num_val_batches,
                 on_metrics=lambda: self._set_progress(val_pending=False)).run()
        trainer._current_fx("training_step")
        trainer._in_train = True
        self.model._results = trainer._train_results
        self.model.train()

    def _log_step(self, results: Results) -> None:
        trainer = self.trainer
        callback, logged, bar = results.collect_step(self.strategy)
        for name, value in callback.items():
            results.values[name].latest = value
        if logged:
            trainer.logged_metrics = logged
            if trainer.is_global_zero:
                metrics = {k: float(v) for k, v in logged.items()}
                metrics["epoch"] = trainer.current_epoch
                for lg in trainer.loggers:
                    lg.log_metrics(metrics, step=trainer.global_step)

    def _log_epoch(self, results: Results) -> None:
        _publish_epoch(self.trainer, results)


def _publish_epoch(trainer: Trainer, results: Results, suffix: str = "") -> dict[str, float]:
    callback, logged, bar = results.collect_epoch(trainer.strategy)
    if suffix:
        callback = {k + suffix: v for k, v in callback.items()}
        logged = {k + suffix: v for k, v in logged.items()}
        bar = {k + suffix: v for k, v in bar.items()}
    trainer._epoch_metrics.update(callback)
    trainer._bar_metrics.update(bar)
    if logged:
        trainer.logged_metrics = logged
        if trainer.is_global_zero and not trainer.sanity_checking:
            metrics = {k: float(v) for k, v in logged.items()}
            metrics["epoch"] = trainer.current_epoch
            for lg in trainer.loggers:
                lg.log_metrics(metrics, step=trainer.global_step)
    return {k: float(v) for k, v in callback.items()}


def _extract_loss(output: Any) -> Tensor | None:
    if type(output) is Tensor and output.requires_grad and output.dim() == 0:
        return output  # the common case, checked first
    if output is None:
        return None
    if isinstance(output, Tensor):
        loss = output
    elif isinstance(output, Mapping) and "loss" in output:
        loss = output["loss"]
        if not isinstance(loss, Tensor):
            raise MisconfiguredModuleError(
                f"training_step returned a dict whose 'loss' is a {type(loss).__name__}, not a tensor. Return the "
                "loss tensor the optimizer should minimise (with its graph), e.g. {'loss': loss}."
            )
    else:
        what = f"a dict without 'loss' (keys: {', '.join(map(repr, output))})" if isinstance(output, Mapping) else (
            f"a {type(output).__name__}"
        )
        raise MisconfiguredModuleError(
            f"training_step returned {what}. It must return the loss tensor, a dict with a 'loss' tensor, or None "
            "to skip the batch."
        )
    if loss.numel() != 1:
        raise MisconfiguredModuleError(
            f"training_step returned a loss of shape {tuple(loss.shape)}; the loss must be a single number. Reduce "
            "it first, e.g. loss.mean()."
        )
    if not loss.requires_grad:
        raise MisconfiguredModuleError(
            "training_step returned a loss that does not require grad, so there is nothing to backpropagate. Was it "
            "computed under torch.no_grad(), detached, or converted with .item()? Return the tensor itself."
        )
    return loss


# ---------------------------------------------------------------------------- evaluation
class EvalLoop:
    """One pass of validation_step/test_step/predict_step over dataloaders, without gradients."""

    def __init__(self, trainer: Trainer, model: Any, stage: str, loaders: list[Any], limits: list[Any],
                 on_metrics: Any = None, collect: bool = False) -> None:
        self.trainer, self.model, self.stage = trainer, model, stage
        self.loaders, self.limits = loaders, limits
        self.on_metrics = on_metrics
        self.collect = collect
        self.predictions: list[list[Any]] = []

    def run(self) -> list[dict[str, float]]:
        trainer, model, strategy, hooks = self.trainer, self.model, self.trainer.strategy, self.trainer._hooks
        hook = _HOOK_STAGE[self.stage]
        step_name = _STEP_NAME[self.stage]
        was_training = model.training
        model.eval()
        hooks.call(f"on_{hook}_start", trainer)
        hooks.call(f"on_{hook}_epoch_start", trainer)
        step_fn = strategy.step_function(trainer._wrapped, step_name)
        trainer._current_fx(step_name)
        multi = len(self.loaders) > 1
        if multi:
            _check_takes_dataloader_idx(getattr(model, step_name), step_name, len(self.loaders))
        per_loader: list[dict[str, float]] = []
        results = Results(self.stage)
        results.device = strategy.root_device
        start_cbs, end_cbs = hooks.cb(f"on_{hook}_batch_start"), hooks.cb(f"on_{hook}_batch_end")
        start_mod, end_mod = hooks.mod(f"on_{hook}_batch_start"), hooks.mod(f"on_{hook}_batch_end")
        grad_ctx = torch.inference_mode if trainer.inference_mode else torch.no_grad
        results_by_loader = []
        for dl_idx, (loader, limit) in enumerate(zip(self.loaders, self.limits)):
            res = results if not multi else Results(self.stage)
            res.device = strategy.root_device
            results_by_loader.append(res)
            model._results = res
            preds: list[Any] = []
            extra = (dl_idx,) if multi else ()
            if not limit:
                self.predictions.append(preds)
                continue
            with grad_ctx():
                for batch_idx, batch in enumerate(loader):
                    if batch_idx >= limit:
                        break
                    batch = strategy.batch_to_device(batch)
                    res.new_batch(batch)
                    for fn in start_cbs:
                        fn(trainer, model, batch, batch_idx, dl_idx)
                    if start_mod is not None:
                        hooks.call_module(trainer, f"on_{hook}_batch_start", start_mod, batch, batch_idx, *extra)
                    with strategy.forward_context():
                        out = step_fn(batch, batch_idx, *extra)
                    if self.collect:
                        preds.append(out)
                    for fn in end_cbs:
                        fn(trainer, model, out, batch, batch_idx, dl_idx)
                    if end_mod is not None:
                        hooks.call_module(trainer, f"on_{hook}_batch_end", end_mod, out, batch, batch_idx, *extra)
            self.predictions.append(preds)
        model._results = results_by_loader[0] if results_by_loader else results
        if self.stage != "predict":
            def publish() -> None:
                per_loader.clear()
                for i, res in enumerate(results_by_loader):
                    per_loader.append(_publish_epoch(trainer, res, f"/dataloader_idx_{i}" if multi else ""))
                if self.on_metrics is not None:
                    self.on_metrics()

            hooks.call_module_between(f"on_{hook}_epoch_end", trainer, between=publish)
        else:
            hooks.call(f"on_{hook}_epoch_end", trainer)
        model._results = None
        hooks.call(f"on_{hook}_end", trainer)
        if was_training:
            model.train()
        return per_loader


def _check_takes_dataloader_idx(fn: Any, name: str, count: int) -> None:
    import inspect

    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params) or len(
        [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    ) >= 3:
        return
    raise MisconfiguredModuleError(
        f"{count} dataloaders were given, so {name} is called as {name}(batch, batch_idx, dataloader_idx), but it "
        f"takes only (batch, batch_idx). Add a dataloader_idx=0 argument to {name}."
    )


def _evaluate_stage(trainer: Trainer, model: Any, stage: str, dl: Any, ckpt_path: Any, verbose: bool) -> list[dict[str, float]]:
    strategy = trainer.strategy
    kind = "val" if stage == "validate" else "test"
    loaders = [strategy.process_dataloader(v, stage) for v in _as_list(_source(trainer, model, kind, dl))]
    if not loaders:
        raise ConfigurationError(
            f"trainer.{stage}() found no data: pass dataloaders=..., a datamodule with {kind}_dataloader(), or "
            f"define {kind}_dataloader() on the model."
        )
    limit = trainer.limit_val_batches if stage == "validate" else trainer.limit_test_batches
    limits = [_num_batches(v, limit) for v in loaders]
    if stage == "validate":
        trainer.num_val_batches = limits
    else:
        trainer.num_test_batches = limits
    _setup_model(trainer, model, with_optimizers=False)
    path = resolve_ckpt_path(trainer, ckpt_path, stage)
    if path is not None:
        restore(trainer, path, full=False)
    trainer._epoch_metrics.clear()
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


def _predict(trainer: Trainer, model: Any, dl: Any, ckpt_path: Any, return_predictions: bool) -> Any:
    strategy = trainer.strategy
    loaders = [strategy.process_dataloader(v, "predict") for v in _as_list(_source(trainer, model, "predict", dl))]
    if not loaders:
        raise ConfigurationError(
            "trainer.predict() found no data: pass dataloaders=..., a datamodule with predict_dataloader(), or "
            "define predict_dataloader() on the model."
        )
    limits = [_num_batches(v, trainer.limit_predict_batches) for v in loaders]
    trainer.num_predict_batches = limits
    _setup_model(trainer, model, with_optimizers=False)
    path = resolve_ckpt_path(trainer, ckpt_path, "predict")
    if path is not None:
        restore(trainer, path, full=False)
    loop = EvalLoop(trainer, model, "predict", loaders, limits, collect=return_predictions)
    loop.run()
    if not return_predictions:
        return None
    return loop.predictions[0] if len(loop.predictions) == 1 else loop.predictions
