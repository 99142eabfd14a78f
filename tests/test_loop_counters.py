"""Lightning's loop counters as callbacks read them: the progress classes, ``trainer.fit_loop.epoch_loop.val_loop``,
``validate_loop``/``test_loop``, the optimizer step counters, and what the fit loop does around them (a stop that
validates first, a replaced ``val_loop.run``, a duration interval without epoch gating, samplers told the epoch)."""

from __future__ import annotations

import copy
import time
import warnings
from unittest import mock

import pytest
from torch.utils.data import DataLoader, SequentialSampler

import torchfleet as tf
from tests.helpers import EpochSampler, LogRecords, Regressor, loader, quiet
from torchfleet.callbacks import Callback, EarlyStopping
from torchfleet.trainer.progress import (
    BatchProgress,
    OptimizerProgress,
    ProcessedTracker,
    Progress,
    ReadyCompletedTracker,
    StartedTracker,
)


# ---------------------------------------------------------------------------- the progress classes
def test_progress_increments_both_trackers_in_order():
    p = BatchProgress()
    p.increment_ready()
    p.increment_started()
    assert p.total == ProcessedTracker(ready=1, started=1) and p.current == p.total
    p.increment_processed()
    p.increment_completed()
    assert p.total == ProcessedTracker(1, 1, 1, 1) and p.current == ProcessedTracker(1, 1, 1, 1)
    p.reset_on_run()  # a new run of the loop: current only
    assert p.current == ProcessedTracker() and p.total.completed == 1
    p.increment_by(3, is_last_batch=True)
    assert p.total.completed == 4 and p.current.ready == 3 and p.is_last_batch
    p.reset()
    assert p == BatchProgress()
    assert copy.deepcopy(p) == p and BatchProgress.from_state_dict(p.state_dict()) == p


def test_progress_reset_on_restart_falls_back_to_the_last_completed_event():
    t = ProcessedTracker(ready=4, started=4, processed=3, completed=2)
    t.reset_on_restart()
    assert t == ProcessedTracker(ready=2, started=2, processed=2, completed=2)


def test_progress_refuses_mixed_trackers_and_missing_counters():
    with pytest.raises(ValueError, match="should be of the same class"):
        Progress(ReadyCompletedTracker(), ProcessedTracker())
    p = Progress.from_defaults(ReadyCompletedTracker, completed=5)
    assert p.total == ReadyCompletedTracker(completed=5) and p.current == p.total
    with pytest.raises(TypeError, match="ReadyCompletedTracker` doesn't have a `started` attribute"):
        p.increment_started()
    with pytest.raises(TypeError, match="doesn't have a `processed` attribute"):
        Progress.from_defaults(StartedTracker).increment_processed()


def test_optimizer_progress_instances_do_not_share_counters():
    a, b = OptimizerProgress(), OptimizerProgress()
    a.step.increment_completed()
    assert a.step.total.completed == 1 and b.step.total.completed == 0


# ---------------------------------------------------------------------------- val_loop and the evaluation loops
class ValCounts(Callback):
    """What Lightning callbacks read of the validation counters, at the points they read them."""

    def __init__(self):
        self.at_train_start = None
        self.at_epoch_end: list[tuple[int, int]] = []
        self.inside_batch: list[tuple[int, int, int, int]] = []

    def on_train_start(self, trainer, module):
        self.at_train_start = trainer.fit_loop.epoch_loop.val_loop.batch_progress.total.completed

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        c = trainer.fit_loop.epoch_loop.val_loop.batch_progress.current
        if not trainer.sanity_checking:
            self.inside_batch.append((c.ready, c.started, c.processed, c.completed))

    def on_train_epoch_end(self, trainer, module):
        bp = trainer.fit_loop.epoch_loop.val_loop.batch_progress
        self.at_epoch_end.append((bp.total.completed, bp.current.completed))


def test_val_loop_counts_the_validation_batches_of_each_epoch():
    rec = ValCounts()
    trainer = tf.Trainer(**quiet(max_epochs=2, limit_train_batches=4, limit_val_batches=3, val_check_interval=0.5,
                                 num_sanity_val_steps=2, callbacks=[rec]))
    trainer.fit(Regressor(), loader(), loader())
    assert rec.at_train_start == 0  # the sanity check's batches are not counted
    # two validations of 3 batches per epoch: total counts the epoch's, current the last validation's
    assert rec.at_epoch_end == [(6, 3), (6, 3)]
    # inside on_validation_batch_end the batch is processed, not yet completed
    assert rec.inside_batch[:3] == [(1, 1, 1, 0), (2, 2, 2, 1), (3, 3, 3, 2)]
    assert trainer.fit_loop.epoch_loop.val_loop is trainer.fit_loop.epoch_loop.val_loop  # one object, kept


def test_validate_and_test_loops_count_their_batches():
    trainer = tf.Trainer(**quiet(limit_val_batches=3, limit_test_batches=2))
    model = Regressor()
    trainer.validate(model, loader())
    trainer.validate(model, loader())
    trainer.test(model, loader())
    assert trainer.validate_loop.batch_progress.current.completed == 3
    assert trainer.validate_loop.batch_progress.total.completed == 6  # both runs
    assert trainer.test_loop.batch_progress.total.completed == 2
    assert trainer.fit_loop.epoch_loop.val_loop.batch_progress.total.completed == 0  # no fit ran
    assert trainer.validate_loop.max_batches == [3] and not trainer.validate_loop.skip


def test_replacing_val_loop_run_replaces_the_validations_of_fit():
    trainer = tf.Trainer(**quiet(max_epochs=3, limit_train_batches=2, limit_val_batches=2))
    calls = []
    trainer.fit_loop.epoch_loop.val_loop.run = lambda: calls.append(trainer.current_epoch)
    model = Regressor()
    trainer.fit(model, loader(), loader())
    assert calls == [0, 1, 2] and "val_loss" not in trainer.callback_metrics
    assert trainer.current_epoch == 3


@pytest.mark.parametrize(("min_epochs", "min_steps", "validations"), [(3, None, 3), (None, 3, 2)])
def test_a_stop_validates_once_when_min_epochs_and_min_steps_allow_it(min_epochs, min_steps, validations):
    # Lightning's #15708: EarlyStopping asks to stop at once, min_epochs/min_steps hold the run; when the stop is
    # allowed mid-epoch, validation runs before the epoch ends (and never twice for one stop)
    class LogsLoss(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss)
            return loss

    stopper = EarlyStopping(monitor="loss", check_on_train_epoch_end=True, stopping_threshold=1e9)
    trainer = tf.Trainer(**quiet(max_epochs=3, limit_train_batches=2, limit_val_batches=2, min_epochs=min_epochs,
                                 min_steps=min_steps, callbacks=[stopper]))
    calls = []
    trainer.fit_loop.epoch_loop.val_loop.run = lambda: calls.append(trainer.global_step)
    trainer.fit(LogsLoss(), loader(), loader())
    assert len(calls) == validations
    if min_steps is not None:
        assert calls == [2, 3] and trainer.global_step == 3  # epoch 0's end, then at the allowed stop


def test_a_stop_held_by_min_epochs_is_said_once():
    class StopAlways(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            trainer.should_stop = True

    trainer = tf.Trainer(**quiet(max_epochs=5, min_epochs=2, limit_train_batches=3, callbacks=[StopAlways()]))
    with LogRecords() as messages:
        trainer.fit(Regressor(), loader())
    held = [m for m in messages if "signaled to stop but the required `min_epochs=2`" in m]
    assert len(held) == 1 and "Training will continue" in held[0]
    assert trainer.current_epoch == 2  # held through two whole epochs, then stopped


def test_epoch_loop_done_follows_should_stop_and_min_steps():
    trainer = tf.Trainer(**quiet(max_epochs=3, min_steps=5))
    loop = trainer.fit_loop.epoch_loop
    assert not loop.done
    trainer.should_stop = True
    assert not loop.done  # min_steps=5 not met at step 0
    trainer.state.global_step = 5
    assert loop.done


# ---------------------------------------------------------------------------- optimizer step counters
class StepCounts(Callback):
    def __init__(self):
        self.seen: list[tuple[int, int, int]] = []

    def on_train_epoch_end(self, trainer, module):
        loop = trainer.fit_loop.epoch_loop
        opt = loop.automatic_optimization.optim_progress
        manual = loop.manual_optimization.optim_step_progress
        self.seen.append((opt.optimizer.step.total.completed, opt.optimizer.step.current.completed,
                          manual.total.completed))


def test_optimizer_step_counters_count_the_run_and_the_epoch():
    rec = StepCounts()
    trainer = tf.Trainer(**quiet(max_epochs=2, limit_train_batches=5, accumulate_grad_batches=2, callbacks=[rec]))
    trainer.fit(Regressor(), loader())
    # 5 batches, accumulating 2: steps after batches 2, 4 and the epoch's last, 3 per epoch
    assert rec.seen == [(3, 3, 3), (6, 3, 6)]
    assert trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer_steps == trainer.global_step


# ---------------------------------------------------------------------------- val_check_interval as a duration
def test_duration_interval_without_epoch_gating_reads_time_monotonic():
    ticks = iter(range(0, 10_000, 2))  # each read of the clock: 2 s later
    with mock.patch("time.monotonic", side_effect=lambda: next(ticks)):
        trainer = tf.Trainer(**quiet(max_epochs=3, limit_train_batches=2, max_steps=5, limit_val_batches=1,
                                     val_check_interval={"seconds": 2}, check_val_every_n_epoch=None,
                                     enable_progress_bar=True))
        trainer.fit(Regressor(), loader(), loader())
    # one clock read per batch (the progress bar's redraws read their own clock): due after every batch
    assert trainer.global_step == 5
    assert trainer.fit_loop.epoch_loop.val_loop.batch_progress.total.completed == 1  # epoch 2's one batch
    assert trainer.validate_loop.batch_progress.total.completed == 0


# ---------------------------------------------------------------------------- validation_step = None, overfit
def test_validation_step_set_to_none_on_the_instance_switches_validation_off():
    model = Regressor()
    model.validation_step = None
    trainer = tf.Trainer(**quiet(max_epochs=1, limit_train_batches=2, num_sanity_val_steps=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.fit(model, loader(), loader())
    assert trainer.num_val_batches == [] and "val_loss" not in trainer.callback_metrics
    with pytest.raises(tf.errors.MisconfiguredModuleError, match="validation_step, which is set to None"):
        trainer.validate(model, loader())


def test_overfit_batches_replaces_a_sampler_of_the_users_with_a_sequential_one():
    data = loader().dataset
    trainer = tf.Trainer(**quiet(max_epochs=1, overfit_batches=2))
    with pytest.warns(UserWarning, match="requested to overfit but enabled train dataloader shuffling"):
        trainer.fit(Regressor(), DataLoader(data, sampler=EpochSampler(len(data)), batch_size=8),
                    DataLoader(data, batch_size=8))
    assert isinstance(trainer.train_dataloader.sampler, SequentialSampler)
    assert trainer.num_training_batches == 2


# ---------------------------------------------------------------------------- samplers told the epoch
def test_evaluation_samplers_hear_the_training_epoch():
    data = loader().dataset
    val_sampler = EpochSampler(len(data))
    trainer = tf.Trainer(**quiet(max_epochs=2, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=1))
    trainer.fit(Regressor(), loader(), DataLoader(data, sampler=val_sampler, batch_size=8))
    assert val_sampler.epochs == [0, 0, 1]  # the sanity check, then each epoch's validation
    test_sampler = EpochSampler(len(data))
    trainer.test(Regressor(), DataLoader(data, sampler=test_sampler, batch_size=8))
    assert test_sampler.epochs == [2]


def test_combined_training_loaders_samplers_hear_each_epoch():
    """As Lightning's fit loop: every loader of a CombinedLoader, its sampler and its batch sampler's sampler."""
    from torch.utils.data import BatchSampler

    from torchfleet.utilities import CombinedLoader

    data = loader().dataset
    plain, inner = EpochSampler(len(data)), EpochSampler(len(data))
    combined = CombinedLoader({"a": DataLoader(data, sampler=plain, batch_size=8),
                               "b": DataLoader(data, batch_sampler=BatchSampler(inner, 8, False))}, "max_size_cycle")

    class Pair(Regressor):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch["a"], batch_idx) + super().training_step(batch["b"], batch_idx)

    tf.Trainer(**quiet(max_epochs=3, limit_train_batches=1, limit_val_batches=0)).fit(Pair(), combined)
    assert plain.epochs == inner.epochs == [0, 1, 2]


def test_fit_loop_clock_is_read_at_each_call():
    # the fit loop reads time.monotonic when it needs it (a patched clock drives a duration interval)
    from torchfleet.trainer import fit_loop

    with mock.patch("time.monotonic", return_value=123.0):
        assert fit_loop._now() == 123.0
    assert abs(fit_loop._now() - time.monotonic()) < 60
