"""Loop flags as Lightning programs use them: ``fast_dev_run``'s stand-in logger and its callbacks, a stage set
by hand on ``trainer.state``, and validation beside training data without a length under the progress bar."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import torchfleet as tf
from tests.helpers import Regressor, loader, make_data, quiet
from torchfleet.callbacks import EarlyStopping
from torchfleet.loggers import CSVLogger, DummyLogger
from torchfleet.trainer.states import RunningStage, TrainerFn


# ---------------------------------------------------------------------------- fast_dev_run
class WritesToItsLogger(Regressor):
    def training_step(self, batch, batch_idx):
        # a Module written for TensorBoard: under fast_dev_run the call must do nothing
        self.logger.experiment.add_histogram("weights", self.net[0].weight, self.global_step)
        self.logger.log_text("note", "written for a real logger")
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("fast_dev_run", [1, 3])
def test_fast_dev_run_puts_a_dummy_logger_in_place_and_never_stops_early(tmp_path, fast_dev_run):
    stopper = EarlyStopping(monitor="never_logged")  # strict: it would raise if it checked
    trainer = tf.Trainer(accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, fast_dev_run=fast_dev_run, logger=CSVLogger(tmp_path),
                         callbacks=[stopper])
    assert len(trainer.loggers) == 1 and isinstance(trainer.logger, DummyLogger)
    trainer.fit(WritesToItsLogger(), loader(), loader())
    assert trainer.global_step == fast_dev_run and trainer.state.finished
    assert not list(tmp_path.iterdir())  # no log folder, no checkpoint
    assert trainer.log_dir == str(tmp_path)


def test_fast_dev_run_without_a_logger_keeps_none():
    trainer = tf.Trainer(accelerator="cpu", fast_dev_run=True, logger=False)
    assert trainer.loggers == [] and trainer.logger is None


def test_dummy_logger_records_nothing_and_copies():
    lg = DummyLogger()
    assert lg.name == "" and lg.version == "" and lg.save_dir is None and lg[0] is lg
    assert lg.anything_at_all(1, key=2) is None and lg.experiment.add_scalar("x", 1.0) is not None
    lg.log_metrics({"a": 1.0}, step=0)
    assert isinstance(copy.deepcopy(lg), DummyLogger) and isinstance(pickle.loads(pickle.dumps(lg)), DummyLogger)


# ---------------------------------------------------------------------------- trainer.state.stage set by hand
@pytest.mark.parametrize(
    ("stage", "fn", "training", "sanity"),
    [
        (RunningStage.TRAINING, TrainerFn.FITTING, True, False),
        (RunningStage.SANITY_CHECKING, TrainerFn.FITTING, False, True),
        (RunningStage.TESTING, TrainerFn.TESTING, False, False),
        ("predict", TrainerFn.PREDICTING, False, False),
        (RunningStage.VALIDATING, TrainerFn.VALIDATING, False, False),
    ],
)
def test_trainer_state_stage_can_be_set_by_hand(stage, fn, training, sanity):
    trainer = tf.Trainer(accelerator="cpu", logger=False)
    trainer.state.stage = stage
    assert trainer.state.stage == stage and trainer.state.fn == fn
    assert trainer.training is training and trainer.sanity_checking is sanity


def test_setting_validating_inside_fit_keeps_fit_and_none_clears_the_stage():
    trainer = tf.Trainer(accelerator="cpu", logger=False)
    trainer.state.stage = RunningStage.TRAINING
    trainer.state.stage = RunningStage.VALIDATING  # fit's validation
    assert trainer.state.fn == "fit" and trainer.validating and not trainer.training
    trainer.state.stage = None
    assert trainer.state.stage == "validate" and not trainer.training  # fn stays: fit outside its loops
    with pytest.raises(ValueError):
        trainer.state.stage = "warmup"


# ---------------------------------------------------------------------------- data without a length, bar on
class Endless(IterableDataset):
    def __iter__(self):
        data = make_data(64)
        while True:
            yield from data


def test_validation_every_n_batches_beside_training_data_without_a_length_under_the_progress_bar():
    # the bar of an epoch of unknown length has no total; validation's bar must not ask its truth value
    seen = []

    class Records(Regressor):
        def validation_step(self, batch, batch_idx):
            seen.append(self.trainer.fit_loop.total_batch_idx + 1)
            return super().validation_step(batch, batch_idx)

    trainer = tf.Trainer(**quiet(enable_progress_bar=True, max_steps=6, val_check_interval=3,
                                 check_val_every_n_epoch=None, limit_val_batches=1))
    trainer.fit(Records(), DataLoader(Endless(), batch_size=8), loader())
    assert seen == [3, 6] and trainer.global_step == 6
    assert torch.isfinite(trainer.callback_metrics["val_loss"])


# ---------------------------------------------------------------------------- dataloader_idx and the loader count
class RequiresIdx(Regressor):
    def validation_step(self, batch, batch_idx, dataloader_idx):
        return super().validation_step(batch, batch_idx)


class HookWithoutIdx(Regressor):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        return super().validation_step(batch, batch_idx)

    def on_validation_batch_end(self, outputs, batch, batch_idx):
        pass


def test_a_required_dataloader_idx_with_one_loader_is_refused_before_the_first_batch():
    trainer = tf.Trainer(**quiet())
    with pytest.raises(tf.errors.DataloaderIdxError, match="single `val_dataloader`, but have included "
                       "`dataloader_idx` in `RequiresIdx.validation_step") as err:
        trainer.validate(RequiresIdx(), loader())
    assert isinstance(err.value, RuntimeError) and isinstance(err.value, tf.ConfigurationError)
    assert trainer.validate_loop.batch_progress.current.ready == 0  # refused before any batch
    out = trainer.validate(RequiresIdx(), [loader(16), loader(16)])  # two loaders: it gets its index
    assert len(out) == 2


def test_a_batch_hook_without_dataloader_idx_with_two_loaders_is_refused():
    with pytest.raises(tf.errors.DataloaderIdxError, match="no `dataloader_idx` argument in "
                       "`HookWithoutIdx.on_validation_batch_end"):
        tf.Trainer(**quiet()).validate(HookWithoutIdx(), [loader(16), loader(16)])
    assert tf.Trainer(**quiet()).validate(HookWithoutIdx(), loader(16))  # one loader: nothing to refuse


# ---------------------------------------------------------------------------- val_check_interval refusals
def test_a_fraction_without_epoch_gating_is_refused_naming_the_duration_alternative():
    with pytest.raises(tf.ConfigurationError, match=r"integer or a time-based duration .* not 0\.5"):
        tf.Trainer(accelerator="cpu", val_check_interval=0.5, check_val_every_n_epoch=None)
    assert tf.Trainer(accelerator="cpu", val_check_interval="00:00:01:00", check_val_every_n_epoch=None)


def test_an_interval_longer_than_the_epoch_is_refused_with_the_ways_out():
    trainer = tf.Trainer(**quiet(limit_train_batches=4, val_check_interval=10))
    with pytest.raises(ValueError, match="must be less than or equal to the number of the training batches.*"
                       "check_val_every_n_epoch=None"):
        trainer.fit(Regressor(), loader(), loader())
