"""One pass of validation_step/test_step/predict_step over dataloaders, and publishing epoch metrics."""

from __future__ import annotations

import inspect
import itertools
import math
from typing import TYPE_CHECKING, Any

import torch

from torchfleet.errors import DataloaderIdxError
from torchfleet.samplers import set_sampler_epoch
from torchfleet.trainer.hooks import batch_transfer_fn, step_capacity, trim_step_arguments
from torchfleet.trainer.logging import Results, logger_step
from torchfleet.trainer.progress import evaluation_loop
from torchfleet.watchdog import set_position

if TYPE_CHECKING:
    from torchfleet.trainer.loop_trainer import LoopTrainer

_STEP_NAME = {"validate": "validation_step", "test": "test_step", "sanity_check": "validation_step", "predict": "predict_step"}
_HOOK_STAGE = {"validate": "validation", "sanity_check": "validation", "test": "test", "predict": "predict"}
#: the strategy's hooks at a pass's start and end (Lightning's, called after the Callbacks' and the Module's)
_STRATEGY_START = {"validation": "on_validation_start", "test": "on_test_start", "predict": "on_predict_start"}
_STRATEGY_END = {"validation": "on_validation_end", "test": "on_test_end", "predict": "on_predict_end"}


def _switch_mode(trainer: LoopTrainer, model: Any, name: str, default: Any) -> None:
    """The Module's ``on_<stage>_model_eval`` / ``_train`` override if it has one, else ``default()``."""
    fn = trainer._hooks.mod(name)
    if fn is None:
        default()
    else:
        trainer._hooks.call_module(trainer, name, fn)


def publish_epoch(trainer: LoopTrainer, results: Results, suffix: str = "") -> dict[str, float]:
    """Reduce ``results`` to epoch metrics, record them on the trainer and send them to the loggers."""
    callback, logged, bar = results.collect_epoch(trainer.strategy, trainer.lightning_module)
    if suffix:
        callback = {k + suffix: v for k, v in callback.items()}
        logged = {k + suffix: v for k, v in logged.items()}
        bar = {k + suffix: v for k, v in bar.items()}
    trainer.state.epoch_metrics.update(callback)
    trainer.state.bar_metrics.update(bar)
    if logged and not trainer.state.sanity_checking:  # as Lightning: the sanity check's values are not kept
        trainer.state.logged_metrics.update(logged)  # every name logged so far, latest values
        if trainer.is_global_zero:
            metrics = {k: float(v) for k, v in logged.items()}
            metrics["epoch"] = trainer.state.current_epoch
            for lg in trainer.loggers:
                lg.log_metrics(metrics=metrics, step=logger_step(trainer))  # by keyword, at the step, as Lightning
    return {k: float(v) for k, v in callback.items()}


class EvalLoop:
    """One pass of validation_step/test_step/predict_step over dataloaders, without gradients."""

    def __init__(self, trainer: LoopTrainer, model: Any, stage: str, loaders: list[Any], limits: list[Any],
                 on_metrics: Any = None, collect: bool = False, indices: Any = None) -> None:
        self.trainer, self.model, self.stage = trainer, model, stage
        self.loaders, self.limits = loaders, limits
        self.on_metrics = on_metrics
        self.collect = collect
        self.predictions: list[list[Any]] = []
        #: predict with a prediction writer: trainer/prediction_indices.py's recorder
        self.indices = indices

    def run(self) -> list[dict[str, float]]:
        """The whole stage, its start and end hooks included, runs without gradients (as in Lightning)."""
        strategy = self.trainer.strategy
        # fsdp cannot evaluate under inference_mode: its gathered parameters are reused in training
        inference = self.trainer.inference_mode and strategy.supports_inference_mode
        with (torch.inference_mode if inference else torch.no_grad)():
            return self._run()

    def _run(self) -> list[dict[str, float]]:
        trainer, model, strategy, hooks = self.trainer, self.model, self.trainer.strategy, self.trainer._hooks
        hook = _HOOK_STAGE[self.stage]
        step_name = _STEP_NAME[self.stage]
        was_training = model.training
        _switch_mode(trainer, model, f"on_{hook}_model_eval", model.eval)
        hooks.call(f"on_{hook}_start", trainer)
        getattr(strategy, _STRATEGY_START[hook])()
        hooks.call(f"on_{hook}_epoch_start", trainer)
        # the strategy's own step (Lightning's Strategy.validation_step, ...) only where its class overrides it
        through_strategy = step_name in trainer._strategy_overrides
        step_fn = getattr(strategy, step_name) if through_strategy else strategy.step_function(trainer.state.wrapped,
                                                                                                 step_name)
        trainer._current_fx(step_name)
        multi = len(self.loaders) > 1
        # each with the number of arguments it gets beside dataloader_idx
        _check_dataloader_idx(model, ((step_name, 2), (f"on_{hook}_batch_start", 2), (f"on_{hook}_batch_end", 3)),
                              len(self.loaders), "val" if hook == "validation" else hook)
        if not multi:  # as Lightning, a step may leave out batch_idx: validation_step(self, batch)
            step_fn = trim_step_arguments(step_fn, model, step_name, 2)
        per_loader: list[dict[str, float]] = []
        results = Results(self.stage)
        results.device = strategy.root_device
        start_cbs, end_cbs = hooks.cb(f"on_{hook}_batch_start"), hooks.cb(f"on_{hook}_batch_end")
        start_mod, end_mod = hooks.mod(f"on_{hook}_batch_start"), hooks.mod(f"on_{hook}_batch_end")
        results_by_loader = []
        # Lightning's counters, read by callbacks (trainer.fit_loop.epoch_loop.val_loop.batch_progress, ...)
        progress = evaluation_loop(trainer, self.stage).batch_progress
        progress.reset_on_run()
        if self.stage == "predict":
            evaluation_loop(trainer, self.stage).set_predictions(self.predictions)
        indices = self.indices
        # named in hang/desync reports (watchdog.py); inside fit, with the training epoch
        epoch = trainer.state.current_epoch if trainer.state.fn == "fit" else None
        for dl_idx, (loader, limit) in enumerate(zip(self.loaders, self.limits)):
            res = results if not multi else Results(self.stage)
            res.device = strategy.root_device
            results_by_loader.append(res)
            model.loop_door.results = res
            preds: list[Any] = []
            transfer = batch_transfer_fn(trainer, dl_idx)
            extra = (dl_idx,) if multi else ()
            # as Lightning: a sampler with set_epoch hears of the training epoch (some users shuffle evaluation by it)
            set_sampler_epoch(loader, trainer.state.current_epoch)
            if not limit:
                self.predictions.append(preds)
                continue
            # as Lightning: the batch after the limit is never read (nor its random draws)
            for batch_idx, batch in enumerate(loader if math.isinf(limit) else itertools.islice(loader, limit)):
                set_position((self.stage, epoch, batch_idx))
                batch = transfer(batch)
                res.new_batch(batch)
                progress.increment_ready()
                for fn in start_cbs:
                    fn(trainer, model, batch, batch_idx, dl_idx)
                if start_mod is not None:
                    hooks.call_module(trainer, f"on_{hook}_batch_start", start_mod, batch, batch_idx, *extra)
                progress.increment_started()
                if through_strategy:  # under the precision's context there
                    out = step_fn(batch, batch_idx, *extra)
                else:
                    with strategy.forward_context():
                        out = step_fn(batch, batch_idx, *extra)
                progress.increment_processed()
                if self.collect:
                    preds.append(strategy.outputs_to_cpu(out))
                if indices is not None:
                    indices.after_step(dl_idx, batch_idx)
                for fn in end_cbs:
                    fn(trainer, model, out, batch, batch_idx, dl_idx)
                if end_mod is not None:
                    hooks.call_module(trainer, f"on_{hook}_batch_end", end_mod, out, batch, batch_idx, *extra)
                progress.increment_completed()
            self.predictions.append(preds)
        # every rank's epoch end, however many batches it ran (loop_shape.py): its reductions are matched
        set_position((self.stage, epoch, "end"))
        model.loop_door.results = results_by_loader[0] if results_by_loader else results
        if self.stage != "predict":
            def publish() -> None:
                per_loader.clear()
                for i, res in enumerate(results_by_loader):
                    per_loader.append(publish_epoch(trainer, res, f"/dataloader_idx_{i}" if multi else ""))
                if self.on_metrics is not None:
                    self.on_metrics()

            hooks.call_module_between(f"on_{hook}_epoch_end", trainer, between=publish)
        else:
            hooks.call(f"on_{hook}_epoch_end", trainer)
        model.loop_door.results = None
        hooks.call(f"on_{hook}_end", trainer)
        if self.stage == "sanity_check":  # as Lightning: the sanity check's batches are not counted
            progress.reset()
        getattr(strategy, _STRATEGY_END[hook])()
        set_position(None)
        if was_training:
            _switch_mode(trainer, model, f"on_{hook}_model_train", model.train)
        return per_loader


def _check_dataloader_idx(model: Any, hooks: tuple[tuple[str, int], ...], count: int, kind: str) -> None:
    """The Module's step and batch hooks (each: its name, the arguments it gets before ``dataloader_idx``) take
    ``dataloader_idx`` when they will get it (several loaders), or give it a default; checked before the first
    batch, as Lightning does."""
    for name, before in hooks:
        fn = getattr(type(model), name, None)  # the class's: fsdp wraps the instance's step
        if fn is None:
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        takes = step_capacity(model, name)
        idx = params.get("dataloader_idx")
        if count > 1 and takes is not None and takes <= before:
            raise DataloaderIdxError(
                f"You provided multiple `{kind}_dataloader` ({count}), but no `dataloader_idx` argument in "
                f"`{type(model).__name__}.{name}()`: it is called with {before + 1} arguments, the last the "
                f"dataloader's index, and takes {takes}. Add a dataloader_idx=0 argument to {name}."
            )
        if count == 1 and idx is not None and idx.default is inspect.Parameter.empty:
            raise DataloaderIdxError(
                f"You provided only a single `{kind}_dataloader`, but have included `dataloader_idx` in "
                f"`{type(model).__name__}.{name}()`, which is then called as {name}(batch, batch_idx) without it. "
                "Either remove the argument or give it a default value, i.e. `dataloader_idx=0`."
            )
