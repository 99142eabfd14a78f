"""One pass of validation_step/test_step/predict_step over dataloaders, and publishing epoch metrics."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

import torch

from torchfleet.errors import MisconfiguredModuleError
from torchfleet.trainer.hooks import batch_transfer_fn, step_capacity, trim_step_arguments
from torchfleet.trainer.logging import Results, logger_step
from torchfleet.watchdog import set_position

if TYPE_CHECKING:
    from torchfleet.trainer.trainer import Trainer

_STEP_NAME = {"validate": "validation_step", "test": "test_step", "sanity_check": "validation_step", "predict": "predict_step"}
_HOOK_STAGE = {"validate": "validation", "sanity_check": "validation", "test": "test", "predict": "predict"}
#: the strategy's hooks at a pass's start and end (Lightning's, called after the Callbacks' and the Module's)
_STRATEGY_START = {"validation": "on_validation_start", "test": "on_test_start", "predict": "on_predict_start"}
_STRATEGY_END = {"validation": "on_validation_end", "test": "on_test_end", "predict": "on_predict_end"}


def _switch_mode(trainer: Trainer, model: Any, name: str, default: Any) -> None:
    """The Module's ``on_<stage>_model_eval`` / ``_train`` override if it has one, else ``default()``."""
    fn = trainer._hooks.mod(name)
    if fn is None:
        default()
    else:
        trainer._hooks.call_module(trainer, name, fn)


def publish_epoch(trainer: Trainer, results: Results, suffix: str = "") -> dict[str, float]:
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

    def __init__(self, trainer: Trainer, model: Any, stage: str, loaders: list[Any], limits: list[Any],
                 on_metrics: Any = None, collect: bool = False) -> None:
        self.trainer, self.model, self.stage = trainer, model, stage
        self.loaders, self.limits = loaders, limits
        self.on_metrics = on_metrics
        self.collect = collect
        self.predictions: list[list[Any]] = []

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
        if multi:
            _check_takes_dataloader_idx(model, step_name, len(self.loaders))
        else:  # as Lightning, a step may leave out batch_idx: validation_step(self, batch)
            step_fn = trim_step_arguments(step_fn, model, step_name, 2)
        per_loader: list[dict[str, float]] = []
        results = Results(self.stage)
        results.device = strategy.root_device
        start_cbs, end_cbs = hooks.cb(f"on_{hook}_batch_start"), hooks.cb(f"on_{hook}_batch_end")
        start_mod, end_mod = hooks.mod(f"on_{hook}_batch_start"), hooks.mod(f"on_{hook}_batch_end")
        results_by_loader = []
        # named in hang/desync reports (watchdog.py); inside fit, with the training epoch
        epoch = trainer.state.current_epoch if trainer.state.fn == "fit" else None
        for dl_idx, (loader, limit) in enumerate(zip(self.loaders, self.limits)):
            res = results if not multi else Results(self.stage)
            res.device = strategy.root_device
            results_by_loader.append(res)
            model._results = res
            preds: list[Any] = []
            transfer = batch_transfer_fn(trainer, dl_idx)
            extra = (dl_idx,) if multi else ()
            if not limit:
                self.predictions.append(preds)
                continue
            # as Lightning: the batch after the limit is never read (nor its random draws)
            for batch_idx, batch in enumerate(loader if math.isinf(limit) else itertools.islice(loader, limit)):
                set_position((self.stage, epoch, batch_idx))
                batch = transfer(batch)
                res.new_batch(batch)
                for fn in start_cbs:
                    fn(trainer, model, batch, batch_idx, dl_idx)
                if start_mod is not None:
                    hooks.call_module(trainer, f"on_{hook}_batch_start", start_mod, batch, batch_idx, *extra)
                if through_strategy:  # under the precision's context there
                    out = step_fn(batch, batch_idx, *extra)
                else:
                    with strategy.forward_context():
                        out = step_fn(batch, batch_idx, *extra)
                if self.collect:
                    preds.append(strategy.outputs_to_cpu(out))
                for fn in end_cbs:
                    fn(trainer, model, out, batch, batch_idx, dl_idx)
                if end_mod is not None:
                    hooks.call_module(trainer, f"on_{hook}_batch_end", end_mod, out, batch, batch_idx, *extra)
            self.predictions.append(preds)
        # every rank's epoch end, however many batches it ran (loop_shape.py): its reductions are matched
        set_position((self.stage, epoch, "end"))
        model._results = results_by_loader[0] if results_by_loader else results
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
        model._results = None
        hooks.call(f"on_{hook}_end", trainer)
        getattr(strategy, _STRATEGY_END[hook])()
        set_position(None)
        if was_training:
            _switch_mode(trainer, model, f"on_{hook}_model_train", model.train)
        return per_loader


def _check_takes_dataloader_idx(model: Any, name: str, count: int) -> None:
    takes = step_capacity(model, name)
    if takes is None or takes >= 3:
        return
    raise MisconfiguredModuleError(
        f"{count} dataloaders were given, so {name} is called as {name}(batch, batch_idx, dataloader_idx), but it "
        f"takes only (batch, batch_idx). Add a dataloader_idx=0 argument to {name}."
    )
