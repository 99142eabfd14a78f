"""The fit loop: epochs of training batches with validation, logging, checkpoint callbacks and exact resume.

Strategy-agnostic: everything device- or process-specific goes through ``trainer.strategy``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any

from torchfleet.errors import ConfigurationError, MisconfiguredModuleError
from torchfleet.samplers import set_sampler_epoch
from torchfleet.seed import capture_rng, restore_rng
from torchfleet.trainer.eval_loop import EvalLoop, publish_epoch
from torchfleet.trainer.hooks import batch_transfer_fn, trim_step_arguments
from torchfleet.trainer.logging import Results, logger_step, open_train_results, train_epoch_results
from torchfleet.trainer.loop_shape import (
    NEVER_LAST,
    LookAhead,
    has_length,
    no_training_warning,
    val_every_fraction,
)
from torchfleet.trainer.progress import note_held_stop
from torchfleet.trainer.state import FitPosition
from torchfleet.trainer.training_step import AutomaticStep
from torchfleet.watchdog import set_position

if TYPE_CHECKING:
    from torchfleet.trainer.loop_trainer import LoopTrainer

def _now() -> float:  # a duration val_check_interval's clock, looked up at each call (as Lightning: a patch drives it)
    return time.monotonic()


class FitLoop:
    """Epochs of training batches, with validation, logging, checkpoint callbacks and exact resume."""

    def __init__(self, trainer: LoopTrainer, model: Any, train_loader: Any, val_loaders: list[Any],
                 lockstep: bool = False, reload: Any = None) -> None:
        self.trainer = trainer
        self._reload = reload or (lambda loop, kind: None)  # reload_dataloaders_every_n_epochs, when due (stage.py)
        self.model = model
        self.loader = train_loader
        self.val_loaders = val_loaders
        self.strategy = trainer.strategy
        #: some rank's training data have no length: the ranks agree before each batch that all have one
        self._lockstep = lockstep
        #: data without a length are read one batch ahead, so that the last batch is known (as in Lightning)
        self._look_ahead = lockstep or not has_length(train_loader)
        n = trainer.num_training_batches
        interval = trainer.val_check_interval
        self._val_seconds = trainer.val_check_seconds
        self._last_val_time = _now() if self._val_seconds is not None else 0.0
        if self._val_seconds is not None:
            self.val_every = 0  # unused: time decides
        elif isinstance(interval, float):
            self.val_every = val_every_fraction(n, interval)
        else:
            # with check_val_every_n_epoch=None the interval counts batches across epochs: it may exceed one
            if trainer.check_val_every_n_epoch is not None and not math.isinf(n) and interval > n:
                raise ConfigurationError(
                    f"val_check_interval={interval} is larger than the number of training batches per epoch ({n}): "
                    "an int `val_check_interval` must be less than or equal to the number of the training batches. "
                    "Use a value <= the epoch length, a float fraction, or check_val_every_n_epoch=None to count "
                    "batches across epochs."
                )
            self.val_every = interval
        # which optional hooks exist, decided once: the per-step path then costs nothing for the rest
        hooks = trainer._hooks
        self._has_before_zero_grad = bool(hooks.cb("on_before_zero_grad")) or hooks.mod("on_before_zero_grad") is not None
        self._custom_zero_grad = hooks.mod("optimizer_zero_grad")
        self._forward_context = self.strategy.forward_context
        overrides = trainer._strategy_overrides
        #: the strategy's own on_train_batch_start, called only when its class overrides it (Lightning's hook)
        self._strategy_batch_start = self.strategy.on_train_batch_start if "on_train_batch_start" in overrides else None
        self._contract_training_step = bool({"training_step", "post_training_step"} & overrides)
        # in manual optimisation the user steps the schedulers, as in Lightning: the Trainer steps none
        self._schedulers = trainer.lr_scheduler_configs if model.automatic_optimization else []
        self._has_step_schedulers = any(c.interval == "step" for c in self._schedulers)
        self._has_epoch_schedulers = any(c.interval == "epoch" and not c.reduce_on_plateau for c in self._schedulers)
        self._lr_scheduler_step = hooks.mod("lr_scheduler_step")  # the Module's override, else None
        self.stepper = AutomaticStep(trainer, model, self._after_step)
        self._batches_before = 0  # training batches of the earlier epochs (check_val_every_n_epoch=None)
        self._val_loop = trainer.fit_loop.epoch_loop.val_loop  # fit validates through its run() (replaceable)
        # SIGTERM/SIGUSR1: polled after every optimizer step (trainer/preemption.py); None outside run_stage
        self._preemption = trainer._preemption

    # -- the fit position (trainer.state.fit_position), saved in checkpoints as loops["fit"] -----
    def _validation_ran(self) -> None:
        self.trainer.state.fit_position.val_pending = False

    def run(self) -> None:
        trainer = self.trainer
        resume = trainer.state.resume
        saved = resume.position if resume is not None else None
        trainer.state.fit_position = FitPosition(epoch=trainer.state.current_epoch)
        start_batch, mid_epoch, resume_rng = 0, None, None
        if resume is not None and saved is not None:
            # the RNG where the run stopped, if it stopped; else the one at the save (a save inside the loop)
            resume_rng = saved.resume_rng or resume.rng
            restored_epoch = trainer.state.current_epoch
            n = trainer.num_training_batches
            before = saved.batches_before  # None: a checkpoint older than that field
            self._batches_before = before if before is not None else 0 if math.isinf(n) else saved.epoch * n
            if saved.epoch_done and not saved.stopped_mid_epoch:
                trainer.state.current_epoch = saved.epoch + 1
                self._batches_before += saved.batches_done
                if resume_rng is not None:
                    restore_rng(resume_rng)
            else:
                trainer.state.current_epoch = saved.epoch
                start_batch, mid_epoch = saved.batches_done, saved
            if self._done():
                # nothing left to run: a checkpoint saved now must still say where the first run stopped
                trainer.state.current_epoch = restored_epoch
                trainer.state.fit_position = dataclasses.replace(saved, resume_rng=resume_rng,
                                                                 batches_before=saved.batches_before or 0)
        if trainer.num_training_batches == 0:  # as Lightning: no training hooks, fit ends after the sanity check
            no_training_warning(trainer)
            return
        trainer.state.in_train = True
        open_train_results(trainer.state, self.model, self.strategy.root_device)  # on_train_start may self.log
        trainer._hooks.call("on_train_start", trainer)
        self.strategy.on_train_start()
        ran = False
        self._reload(self, None)  # the loaders fit started with count as asked for at this (restored) epoch
        while not self._done():
            ran = True
            if mid_epoch is not None:
                empty = self.run_epoch(start_batch, mid_epoch, resume_rng)
                mid_epoch = None
            else:
                self._reload(self, "train")
                empty = self.run_epoch(0, None, None)
            self._batches_before += trainer.state.fit_position.batches_done
            stop = trainer.state.should_stop and self._may_stop(trainer.state.current_epoch + 1)
            if empty:  # data without a length that gave no batch: the next epoch would not either
                no_training_warning(trainer, trainer.state.current_epoch)
            # the epoch counts as done even when a stop ended it early, as when max_epochs ends the run
            trainer.state.current_epoch += 1
            if stop or empty:
                break
        if ran and trainer.state.fit_position.resume_rng is None:
            # stopped at an epoch end: the next epoch would start from this RNG state
            trainer.state.fit_position.resume_rng = capture_rng()
        trainer._hooks.call("on_train_end", trainer)
        self.strategy.on_train_end()

    def _done(self) -> bool:
        t = self.trainer
        if t.max_steps != -1 and t.state.global_step >= t.max_steps:
            return True
        if t.state.should_stop and self._may_stop(t.state.current_epoch):  # set before fit (a spent Timer)
            return True
        return t.max_epochs != -1 and t.state.current_epoch >= t.max_epochs

    def _may_stop(self, epochs_done: int) -> bool:
        """Whether a requested stop may end fit after ``epochs_done`` epochs (rank 0 says once if it may not)."""
        t = self.trainer
        may = epochs_done >= t.min_epochs and t.state.global_step >= t.min_steps
        if not may:
            note_held_stop(t)
        return may

    def run_epoch(self, start_batch: int, resume_at: FitPosition | None, rng: dict | None) -> bool:
        """One epoch from ``start_batch``; True when the data gave no batch at all (an iterable that is empty)."""
        trainer, strategy, model, hooks = self.trainer, self.strategy, self.model, self.trainer._hooks
        state = trainer.state
        set_sampler_epoch(self.loader, state.current_epoch)
        # The iterator's shuffle order and worker seeds come from the global RNG when it is created:
        # remember that state so a resumed run recreates the same order.
        if resume_at is not None and resume_at.epoch_start_rng is not None:
            restore_rng(resume_at.epoch_start_rng)
        epoch_start_rng = capture_rng()
        steps_before = resume_at.steps_before if resume_at is not None else None
        state.fit_position = FitPosition(
            epoch=state.current_epoch, batches_done=start_batch, epoch_start_rng=epoch_start_rng,
            batches_before=self._batches_before, epoch_stepped=resume_at is not None and resume_at.epoch_stepped,
            steps_before=steps_before if steps_before is not None else state.global_step)
        if resume_at is None:  # as Lightning: val_loop's total counts the validation batches of this epoch
            self._val_loop.batch_progress.total.reset()
        results = train_epoch_results(state, strategy.root_device)
        state.train_results = results
        model.loop_door.results = results
        model.train()
        state.in_train = True
        hooks.call("on_train_epoch_start", trainer)
        # a callback may have added or swapped a scheduler there (StochasticWeightAveraging puts SWALR in)
        self._has_epoch_schedulers = any(c.interval == "epoch" and not c.reduce_on_plateau for c in self._schedulers)
        iterator = iter(self.loader)
        for _ in range(start_batch):  # fast-forward to where the interrupted run stopped
            next(iterator, None)
        if rng is not None:
            restore_rng(rng)
        if resume_at is not None and resume_at.val_pending:
            self._validate()

        limit = trainer.num_training_batches
        if not math.isinf(limit):  # as Lightning: the batch after the limit is never read (nor its random draws)
            iterator = itertools.islice(iterator, max(0, limit - start_batch))
        stepper = self.stepper
        accumulate = stepper.read_accumulate()
        log_every = trainer.log_every_n_steps or sys.maxsize  # 0: never by steps (barebones)
        automatic = model.automatic_optimization
        opt = trainer.optimizers[0] if trainer.optimizers else None
        step_fn = trim_step_arguments(strategy.step_function(state.wrapped, "training_step"), model, "training_step", 2)
        manual_step = self._manual_step_function(step_fn) if not automatic else None
        strategy_batch_start = self._strategy_batch_start
        batch_start_cbs = hooks.cb("on_train_batch_start")
        batch_start_mod = hooks.mod("on_train_batch_start")
        batch_end_cbs = hooks.cb("on_train_batch_end")
        batch_end_mod = hooks.mod("on_train_batch_end")
        transfer = batch_transfer_fn(trainer, 0)
        position = state.fit_position
        preemption = self._preemption
        agreement = preemption.agreement or preemption.start_loop() if preemption is not None else None
        trainer._current_fx("training_step")
        window_has_grads = False
        stopped = is_last = False
        epoch = state.current_epoch
        ahead = LookAhead(iterator, strategy if self._lockstep else None, epoch) if self._look_ahead else NEVER_LAST
        batch_idx = None
        for batch_idx, batch in enumerate(ahead if self._look_ahead else iterator, start_batch):
            set_position(("training", epoch, batch_idx))  # named in hang/desync reports (watchdog.py)
            trainer.is_last_batch = is_last = batch_idx + 1 >= limit or ahead.last
            batch = transfer(batch)
            results.new_batch(batch)
            skip_rest = False
            for fn in batch_start_cbs:
                fn(trainer, model, batch, batch_idx)
            if batch_start_mod is not None:
                skip_rest = hooks.call_module(trainer, "on_train_batch_start", batch_start_mod, batch, batch_idx) == -1
            if strategy_batch_start is not None:
                strategy_batch_start(batch, batch_idx)
            if skip_rest:
                break
            if automatic:
                boundary = (batch_idx + 1) % accumulate == 0 or is_last
                outputs, window_has_grads = stepper.run(step_fn, batch, batch_idx, boundary, window_has_grads, opt)
            else:
                outputs = manual_step(batch, batch_idx)  # type: ignore[misc]
                boundary = True
            position.batches_done = batch_idx + 1
            validate_now = self._should_validate(batch_idx, is_last)
            position.val_pending = validate_now
            if boundary and state.global_step % log_every == 0 and state.global_step > 0 and (
                automatic or outputs is not None
            ):
                self._log_step(results)
            for fn in batch_end_cbs:
                fn(trainer, model, outputs, batch, batch_idx)
            if batch_end_mod is not None:
                hooks.call_module(trainer, "on_train_batch_end", batch_end_mod, outputs, batch, batch_idx)
            if is_last and self._has_epoch_schedulers:
                # the whole epoch ran: its schedulers step now, before the epoch-end validation, so that a
                # checkpoint ModelCheckpoint writes there holds their state after this epoch's step
                self._step_schedulers("epoch", plateau=False)
                position.epoch_stepped = True
            if validate_now:
                self._validate()
            # inside an epoch only the epochs before it count towards min_epochs: that one runs to its end
            if state.should_stop and self._may_stop(state.current_epoch):
                stopped = True
                break
            if trainer.max_steps != -1 and state.global_step >= trainer.max_steps:
                stopped = True
                break
            # after a whole step: the ranks agree on a preemption signal, save here and raise Preempted (every few
            # steps; at once on the epoch's last step, before the epoch-end work)
            if agreement is not None and boundary and (signum := agreement.poll(is_last)):
                preemption.stop(signum)
        del iterator
        if isinstance(ahead, LookAhead):
            ahead.iterator = iter(())  # its loader's workers stop now, as when ``iterator`` goes
        set_position(("training", epoch, "end"))
        if ahead.uneven:
            no_training_warning(trainer, epoch, uneven=True)
        # A stop before the epoch's last batch: a resumed run continues this epoch from the next batch, with the
        # RNG as it is here, before the end-of-epoch work below (an uninterrupted run would not do it here).
        cut_short = stopped and not is_last
        if cut_short:
            position.stopped_mid_epoch, position.resume_rng = True, capture_rng()
        # epoch end: ordinary callbacks and the Module, then epoch metrics and epoch schedulers,
        # then ModelCheckpoint/EarlyStopping, which see all of that.
        model.loop_door.results = results

        def finish_epoch() -> None:
            self._sync_latest(results)
            self._log_epoch(results)
            if not cut_short:  # as Lightning: epoch schedulers step only after a whole epoch
                # ReduceLROnPlateau steps here, on the epoch's metrics; the others stepped after the last batch
                # (unless the epoch's length is unknown)
                self._step_schedulers("epoch", plateau=None if not position.epoch_stepped else True)
            position.epoch_done, position.val_pending = True, False

        hooks.call_module_between("on_train_epoch_end", trainer, between=finish_epoch)
        model.loop_door.results = None
        set_position(None)
        return batch_idx is None and start_batch == 0

    def _manual_step_function(self, step_fn: Any) -> Any:
        """Manual optimisation's step: the Module's training_step (under the precision's forward context, as
        Lightning's ``Strategy.training_step``), or the strategy's own when its class overrides it."""
        strategy = self.strategy
        if self._contract_training_step:
            takes = self.stepper._takes

            def contract_step(batch: Any, batch_idx: int) -> Any:
                output = strategy.training_step(*(batch, batch_idx)[:takes])
                strategy.post_training_step()
                return output

            return contract_step
        forward_context = self._forward_context

        def step(batch: Any, batch_idx: int) -> Any:
            with forward_context():
                return step_fn(batch, batch_idx)

        return step

    def _after_step(self, opt: Any, batch_idx: int) -> None:
        trainer = self.trainer
        if self._has_before_zero_grad:
            trainer._hooks.call("on_before_zero_grad", trainer, opt)
        zero = self._custom_zero_grad
        if zero is not None:
            zero(trainer.state.current_epoch, batch_idx, opt)
        else:
            opt.zero_grad(set_to_none=True)
        if self._has_step_schedulers:
            self._step_schedulers("step")

    def _step_schedulers(self, interval: str, plateau: bool | None = None) -> None:
        """Step the Trainer's schedulers of ``interval`` that are due; ``plateau``: only ReduceLROnPlateau (True),
        only the others (False), or both (None). None in manual optimisation, where the user steps them."""
        trainer = self.trainer
        count = trainer.state.global_step if interval == "step" else trainer.state.current_epoch + 1
        for config in self._schedulers:
            if config.interval != interval or count % config.frequency:
                continue
            if plateau is not None and config.reduce_on_plateau is not plateau:
                continue
            metric = None
            if config.reduce_on_plateau:
                metrics = trainer.callback_metrics
                if config.monitor not in metrics:
                    if config.strict:
                        raise MisconfiguredModuleError(
                            f"The ReduceLROnPlateau scheduler watches {config.monitor!r}, which was not logged. "
                            f"Logged metrics: {', '.join(sorted(metrics)) or 'none'}. Log it with self.log, or "
                            "pass 'strict': False in the lr_scheduler dict to skip such steps."
                        )
                    if trainer.is_global_zero:
                        warnings.warn(
                            f"The ReduceLROnPlateau scheduler watches {config.monitor!r}, which was not logged, and "
                            "'strict' is False: skipping this learning-rate update.",
                            RuntimeWarning,
                            stacklevel=2,
                        )
                    continue
                metric = metrics[config.monitor]
            if self._lr_scheduler_step is not None:
                self._lr_scheduler_step(config.scheduler, metric)
            elif metric is None:
                config.scheduler.step()
            else:
                config.scheduler.step(float(metric))

    def _should_validate(self, batch_idx: int, is_last: bool) -> bool:
        trainer = self.trainer
        if not self.val_loaders or not any(trainer.num_val_batches):
            return False
        every_n_epochs = trainer.check_val_every_n_epoch
        if every_n_epochs is not None and (trainer.state.current_epoch + 1) % every_n_epochs:
            return False
        if trainer.state.should_stop and self._may_stop(trainer.state.current_epoch):
            return True  # as Lightning: a stop that min_epochs/min_steps allow validates before it ends the epoch
        if self._val_seconds is not None:
            due = _now() - self._last_val_time >= self._val_seconds
            # every rank's clock differs: validate when any rank's time is up, all ranks together
            return self.strategy.reduce_boolean_decision(due, all=False) if self.strategy.world_size > 1 else due
        if every_n_epochs is None:  # as Lightning: every val_check_interval batches, counted across epochs
            return (self._batches_before + batch_idx + 1) % self.val_every == 0
        if isinstance(trainer.val_check_interval, float) and trainer.val_check_interval == 1.0:
            return is_last
        return (batch_idx + 1) % self.val_every == 0

    def _validate(self) -> None:
        self._val_loop.run()  # looked up at each call: a replaced run() replaces the validation

    def _run_validation(self) -> None:  # trainer.fit_loop.epoch_loop.val_loop.run() while fit runs
        trainer = self.trainer
        self._reload(self, "val")
        trainer.state.in_train = False
        EvalLoop(trainer, self.model, "validate", self.val_loaders, trainer.num_val_batches,
                 on_metrics=self._validation_ran).run()
        trainer._current_fx("training_step")
        trainer.state.in_train = True
        self._last_val_time = _now()  # a duration interval counts from the end of a validation
        self.model.loop_door.results = trainer.state.train_results
        self.model.train()

    def _log_step(self, results: Results) -> None:
        trainer = self.trainer
        callback, logged, bar = results.collect_step(self.strategy)
        for name, value in callback.items():
            results.values[name].latest = value
        if logged:
            trainer.state.logged_metrics.update(logged)  # as Lightning: every name logged so far, latest values
            if trainer.is_global_zero:
                metrics = {k: float(v) for k, v in logged.items()}
                metrics["epoch"] = trainer.state.current_epoch
                for lg in trainer.loggers:
                    lg.log_metrics(metrics=metrics, step=logger_step(trainer))  # by keyword, at the step, as Lightning

    def _sync_latest(self, results: Results) -> None:
        # on-step values logged since the last logging point: reduce them now (one collective for all),
        # so epoch-end callbacks and callback_metrics after fit see the synced values
        if self.strategy.world_size > 1:
            callback, _, _ = results.collect_step(self.strategy)
            for name, value in callback.items():
                results.values[name].latest = value

    def _log_epoch(self, results: Results) -> None:
        publish_epoch(self.trainer, results)
