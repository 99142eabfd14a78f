"""Loop settings and run state that ported Lightning code reads: trainer.state, trainer.fit_loop, overfit_batches,
a duration val_check_interval, validation_step = None, benchmark, and the notices about defaults."""

from __future__ import annotations

import logging
import warnings
from datetime import timedelta

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import torchfleet as tf
from tests.helpers import Regressor, loader, make_data, quiet
from torchfleet.callbacks import Callback, EarlyStopping
from torchfleet.errors import PossibleUserWarning
from torchfleet.trainer import fit_loop as fit_loop_module
from torchfleet.trainer.states import RunningStage, TrainerFn, TrainerStatus


# ---------------------------------------------------------------------------- trainer.state
class StateRecorder(Callback):
    def __init__(self):
        self.seen: dict[str, tuple] = {}

    def _note(self, name, trainer):
        self.seen.setdefault(name, (trainer.state.fn, trainer.state.stage, trainer.state.status))

    def on_sanity_check_start(self, trainer, module):
        self._note("sanity", trainer)

    def on_train_start(self, trainer, module):
        self._note("train_start", trainer)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._note("train_batch", trainer)

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self._note("val_batch", trainer)

    def on_test_start(self, trainer, module):
        self._note("test", trainer)

    def on_predict_start(self, trainer, module):
        self._note("predict", trainer)


def test_trainer_state_has_lightnings_fn_stage_and_status():
    rec = StateRecorder()
    trainer = tf.Trainer(**quiet(max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=1,
                                 callbacks=[rec]))
    assert trainer.state.status == "initializing" and trainer.state.fn is None and trainer.state.stage is None
    model = Regressor()
    trainer.fit(model, loader(), loader())
    running = TrainerStatus.RUNNING
    assert rec.seen["sanity"] == ("fit", "sanity_check", running)
    assert rec.seen["train_start"] == (TrainerFn.FITTING, RunningStage.TRAINING, running)
    assert rec.seen["train_batch"] == ("fit", "train", "running")
    assert rec.seen["val_batch"] == ("fit", "validate", "running")
    assert trainer.state.status is TrainerStatus.FINISHED and trainer.state.finished and trainer.state.stopped
    assert trainer.state.fn is None and trainer.state.stage is None
    trainer.test(model, loader())
    trainer.predict(model, loader())
    assert rec.seen["test"] == ("test", "test", "running") and rec.seen["predict"] == ("predict", "predict", "running")
    # the enums print and compare as their values, as Lightning's do
    assert str(TrainerFn.FITTING) == "fit" and RunningStage.SANITY_CHECKING.evaluating
    assert not RunningStage.TRAINING.evaluating


def test_trainer_state_is_interrupted_when_the_stage_raises():
    class Boom(Regressor):
        def training_step(self, batch, batch_idx):
            raise ValueError("boom")

    trainer = tf.Trainer(**quiet(max_epochs=1))
    with pytest.raises(ValueError, match="boom"):
        trainer.fit(Boom(), loader())
    assert trainer.state.status is TrainerStatus.INTERRUPTED and trainer.state.stopped and not trainer.state.finished


# ---------------------------------------------------------------------------- trainer.fit_loop
class ProgressReader(Callback):
    """Reads the counters the way Lightning callbacks do; stretches the run through fit_loop.max_epochs."""

    def __init__(self):
        self.batches: list[tuple[int, int, int]] = []
        self.epochs_at_start: list[tuple[int, int]] = []
        self.epochs_at_end: list[int] = []

    def on_train_start(self, trainer, module):
        assert trainer.fit_loop.max_epochs == 1
        trainer.fit_loop.max_epochs = 3  # code that extends a run does this

    def on_train_epoch_start(self, trainer, module):
        p = trainer.fit_loop.epoch_progress.current
        self.epochs_at_start.append((p.started, p.completed))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        loop = trainer.fit_loop
        self.batches.append((loop.epoch_loop.batch_progress.current.completed, loop.total_batch_idx, loop.batch_idx))

    def on_train_epoch_end(self, trainer, module):
        self.epochs_at_end.append(trainer.fit_loop.epoch_progress.total.completed)


def test_fit_loop_progress_counters_and_settable_limits():
    reader = ProgressReader()
    trainer = tf.Trainer(**quiet(max_epochs=1, limit_train_batches=3, callbacks=[reader]))
    trainer.fit(Regressor(), loader())
    assert trainer.current_epoch == 3 and trainer.max_epochs == 3  # the callback's max_epochs=3 was obeyed
    # epoch k: started k+1, completed k while it runs; at its end (before the counter moves) still k
    assert reader.epochs_at_start == [(1, 0), (2, 1), (3, 2)]
    assert reader.epochs_at_end == [0, 1, 2]
    expected = [(b + 1, e * 3 + b, b) for e in range(3) for b in range(3)]
    assert reader.batches == expected
    assert trainer.fit_loop.epoch_progress.current.completed == 3 and trainer.fit_loop.done


def test_progress_bar_and_early_stopping_callback_lists():
    first, second = EarlyStopping(monitor="a"), EarlyStopping(monitor="b")
    trainer = tf.Trainer(accelerator="cpu", logger=False, callbacks=[first, second])
    assert trainer.early_stopping_callbacks == [first, second] and trainer.early_stopping_callback is first
    assert trainer.progress_bar_callback is not None and trainer.progress_bar_callback in trainer.callbacks
    assert tf.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False).progress_bar_callback is None
    assert tf.Trainer(accelerator="cpu", logger=False).early_stopping_callbacks == []


def test_trainer_attributes_callbacks_read():
    # Lightning's names callbacks use: the module, the stage's loaders, the last-batch flag, sanity batches
    seen: dict = {}

    class Reader(Callback):
        def on_sanity_check_end(self, trainer, module):
            seen["sanity"] = list(trainer.num_sanity_val_batches)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.setdefault("last", []).append(trainer.is_last_batch)
            seen["module"] = trainer.lightning_module
            seen["loaders"] = (trainer.train_dataloader, trainer.val_dataloaders)

    model = Regressor()
    train, val, other = loader(32), loader(16), loader(24)
    trainer = tf.Trainer(**quiet(max_epochs=2, num_sanity_val_steps=1, callbacks=[Reader()]))
    trainer.fit(model, train, val)
    assert seen["module"] is model and trainer.lightning_module is model
    assert seen["sanity"] == [1]
    assert seen["last"] == [False, False, False, True] * 2  # 32 samples in batches of 8, two epochs
    assert seen["loaders"] == (train, val) and not trainer.interrupted
    trainer.validate(model, other, verbose=False)
    assert trainer.val_dataloaders is other
    trainer.test(model, other, verbose=False)
    trainer.predict(model, val)
    assert (trainer.test_dataloaders, trainer.predict_dataloaders) == (other, val)

    class Fails(Regressor):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    failing = tf.Trainer(**quiet(max_epochs=1))
    with pytest.raises(RuntimeError, match="boom"):
        failing.fit(Fails(), train)
    assert failing.interrupted


# ---------------------------------------------------------------------------- overfit_batches
class BatchRecorder(Regressor):
    def __init__(self):
        super().__init__()
        self.train_seen: list[list[torch.Tensor]] = []
        self.val_batches = 0

    def on_train_epoch_start(self):
        self.train_seen.append([])

    def training_step(self, batch, batch_idx):
        self.train_seen[-1].append(batch[0].clone())
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.val_batches += 1


def test_overfit_batches_trains_on_the_same_first_batches_in_order():
    data = make_data(64)
    model = BatchRecorder()
    trainer = tf.Trainer(**quiet(max_epochs=2, overfit_batches=2))
    assert (trainer.limit_train_batches, trainer.limit_val_batches) == (2, 2)
    with pytest.warns(UserWarning, match="overfit_batches.*shuffles"):
        trainer.fit(model, DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=8))
    first_two = [data.tensors[0][:8], data.tensors[0][8:16]]  # the dataset's first batches, unshuffled
    for epoch in model.train_seen:
        assert len(epoch) == 2 and all(torch.equal(a, b) for a, b in zip(epoch, first_two))
    assert model.val_batches == 2 * 2  # two validation batches after each of the two epochs


def test_overfit_batches_fraction_and_bad_value():
    trainer = tf.Trainer(**quiet(max_epochs=1, overfit_batches=0.25))
    model = BatchRecorder()
    trainer.fit(model, loader(64, batch_size=8), loader(64, batch_size=8))
    assert len(model.train_seen[0]) == 2 and model.val_batches == 2  # a quarter of 8 batches
    with pytest.raises(tf.ConfigurationError, match="overfit_batches=-1"):
        tf.Trainer(accelerator="cpu", overfit_batches=-1)


# ---------------------------------------------------------------------------- val_check_interval as a duration
class Clocked(Regressor):
    """Each training batch 'takes' 10 seconds of the fit loop's clock; counts validations."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock
        self.validated_after: list[int] = []

    def training_step(self, batch, batch_idx):
        self.clock[0] += 10.0
        return super().training_step(batch, batch_idx)

    def on_validation_start(self):
        self.validated_after.append(self.trainer.global_step)


@pytest.mark.parametrize("interval", ["00:00:00:25", timedelta(seconds=25), {"seconds": 25}])
def test_duration_val_check_interval_validates_when_the_time_is_up(monkeypatch, interval):
    clock = [1000.0]
    monkeypatch.setattr(fit_loop_module, "_now", lambda: clock[0])
    model = Clocked(clock)
    trainer = tf.Trainer(**quiet(max_epochs=2, val_check_interval=interval, limit_val_batches=1))
    assert trainer.val_check_seconds == 25.0
    trainer.fit(model, loader(64, batch_size=8), loader(16, batch_size=8))
    # 16 batches of 10 s: due after 30 s, counted again from each validation's end; no extra epoch-end check
    assert model.validated_after == [3, 6, 9, 12, 15]


@pytest.mark.parametrize("bad", ["10 minutes", "00:00:00:00", {"fortnights": 1}])
def test_duration_val_check_interval_that_is_not_one_is_refused(bad):
    with pytest.raises(tf.ConfigurationError, match="val_check_interval=.*is not a valid duration"):
        tf.Trainer(accelerator="cpu", val_check_interval=bad)


# ---------------------------------------------------------------------------- validation_step = None
class RefusesReads(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        raise AssertionError("validation data was read although validation is switched off")


def test_validation_step_none_switches_validation_off():
    class NoVal(Regressor):
        validation_step = None

    trainer = tf.Trainer(**quiet(max_epochs=2, num_sanity_val_steps=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # switching it off on purpose is not worth a warning
        trainer.fit(NoVal(), loader(), DataLoader(RefusesReads(), batch_size=4))
    assert trainer.current_epoch == 2 and "val_loss" not in trainer.callback_metrics
    with pytest.raises(tf.errors.MisconfiguredModuleError, match="validation_step, which is set to None"):
        trainer.validate(NoVal(), loader())


def test_validation_data_without_validation_step_is_skipped_with_a_warning():
    class TrainOnly(tf.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = tf.Trainer(**quiet(max_epochs=1))
    with pytest.warns(UserWarning, match="defines no validation_step: validation is skipped"):
        trainer.fit(TrainOnly(), loader(), DataLoader(RefusesReads(), batch_size=4))


# ---------------------------------------------------------------------------- benchmark
@pytest.fixture
def keep_cudnn_benchmark():
    before = torch.backends.cudnn.benchmark
    yield
    torch.backends.cudnn.benchmark = before


def test_benchmark_sets_cudnn_benchmark(keep_cudnn_benchmark):
    torch.backends.cudnn.benchmark = False
    tf.Trainer(accelerator="cpu", benchmark=True)
    assert torch.backends.cudnn.benchmark is True
    tf.Trainer(accelerator="cpu")  # None leaves it as it is
    assert torch.backends.cudnn.benchmark is True
    tf.Trainer(accelerator="cpu", deterministic=True)  # None with deterministic: off
    assert torch.backends.cudnn.benchmark is False
    with pytest.warns(UserWarning, match="benchmark mode picks kernels"):
        tf.Trainer(accelerator="cpu", deterministic=True, benchmark=True)
    with pytest.raises(tf.ConfigurationError, match="benchmark='yes' is not valid"):
        tf.Trainer(accelerator="cpu", benchmark="yes")


# ---------------------------------------------------------------------------- notices about defaults
def test_max_epochs_default_and_single_batch_notices(caplog):
    class StopAtOnce(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            trainer.should_stop = True

    with pytest.warns(PossibleUserWarning, match="`max_epochs` was not set. Setting it to 1000 epochs: fit stops "
                                                 "after 1000 epochs"):
        tf.Trainer(**quiet(callbacks=[StopAtOnce()])).fit(Regressor(), loader())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tf.Trainer(**quiet(max_steps=2)).fit(Regressor(), loader())  # max_steps set: no notice
    with caplog.at_level(logging.INFO, logger="torchfleet"):
        tf.Trainer(accelerator="cpu", limit_train_batches=1, val_check_interval=1, logger=False)
    text = caplog.text
    assert "`Trainer(limit_train_batches=1)` was configured so 1 batch per epoch will be used" in text
    assert "`Trainer(val_check_interval=1)` was configured so validation will run after every batch" in text
    assert "limit_val_batches" not in text  # 1.0 (the default) is not worth a notice

