"""RunState: the Trainer's run state in one object; its counters are the Trainer's public attributes."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf
from torchfleet.trainer.state import FitPosition, ResumePoint, RunState, TrainerFn


class Tiny(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_public_counters_read_and_write_the_state():
    trainer = tf.Trainer(accelerator="cpu", logger=False)
    assert isinstance(trainer.state, RunState)
    trainer.global_step, trainer.current_epoch, trainer.should_stop = 7, 2, True
    assert (trainer.state.global_step, trainer.state.current_epoch, trainer.state.should_stop) == (7, 2, True)
    trainer.state.fn = TrainerFn.FITTING
    assert trainer.stage == "fit" and tf.Trainer.global_step.__doc__
    # one name per concept: trainer.stage is the entry point (state.fn); state.stage what runs inside it
    assert trainer.stage is trainer.state.fn and trainer.state.stage == "validate"
    trainer.state.stage = "train"
    assert trainer.stage == "fit" and trainer.training and not trainer.validating


def test_state_dict_round_trip_and_stage_start():
    position = FitPosition(epoch=3, batches_done=5, steps_before=35)
    state = RunState(current_epoch=3, global_step=40, fit_position=position)
    saved = {**state.state_dict(), "rng": {"torch": None}}
    # on disk a plain dict, keyed by the fields' names
    assert saved["loops"] == {"fit": {"epoch": 3, "batches_done": 5, "epoch_done": False, "val_pending": False,
                                      "epoch_start_rng": None, "stopped_mid_epoch": False, "resume_rng": None,
                                      "epoch_stepped": False, "batches_before": 0, "steps_before": 35}}
    other = RunState()
    other.load_state_dict(saved)
    assert (other.current_epoch, other.global_step) == (3, 40)
    assert other.resume == ResumePoint(position, {"torch": None})
    other.should_stop = True
    other.start_stage("validate")
    assert other.stage == "validate" and not other.should_stop and other.resume is None and other.fit_position is None
    assert RunState().state_dict()["loops"] == {}


def test_a_fit_position_of_an_older_checkpoint_loads_with_what_it_lacks_unknown():
    # written before batches_before and steps_before were saved: both read as not known (None), and stay unsaved
    old = {"epoch": 2, "batches_done": 4, "epoch_done": True, "val_pending": False, "epoch_start_rng": None,
           "resume_rng": None, "some_future_key": 1}
    state = RunState()
    state.load_state_dict({"epoch": 2, "global_step": 12, "loops": {"fit": old}})
    position = state.resume.position
    assert (position.epoch, position.batches_done, position.epoch_done) == (2, 4, True)
    assert position.batches_before is None and position.steps_before is None and not position.stopped_mid_epoch
    assert position.to_checkpoint() == {k: v for k, v in old.items() if k != "some_future_key"} | {
        "stopped_mid_epoch": False, "epoch_stepped": False}
    state.load_state_dict({"epoch": 0, "global_step": 0, "loops": {}})  # a checkpoint saved outside fit
    assert state.resume == ResumePoint(None, None)


def test_snapshot_carries_counters_and_metrics():
    state = RunState(current_epoch=1, global_step=4, should_stop=True, logged_metrics={"a": 1.0})
    snap = state.snapshot({"m": torch.tensor(2.0)}, {"bar": 3.0})
    other = RunState()
    other.load_snapshot(snap)
    assert (other.current_epoch, other.global_step, other.should_stop) == (1, 4, True)
    assert other.epoch_metrics["m"].item() == 2.0 and other.bar_metrics == {"bar": 3.0}
    assert other.logged_metrics == {"a": 1.0}


def test_fit_advances_the_state():
    trainer = tf.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(6, 2)), batch_size=2))
    assert (trainer.state.current_epoch, trainer.state.global_step) == (2, 6)
    assert trainer.state.fit_position.epoch_done and trainer.state.stage is None
    assert "loss" in trainer.callback_metrics


def test_trainer_state_compares_status_fn_and_stage():
    from torchfleet.trainer.states import RunningStage, TrainerState, TrainerStatus

    trainer = tf.Trainer(accelerator="cpu", logger=False)
    assert trainer.state == TrainerState(status=TrainerStatus.INITIALIZING, fn=None, stage=None)
    assert trainer.state != TrainerState(status=TrainerStatus.FINISHED)
    seen = []

    class Watch(tf.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append(trainer.state == TrainerState(TrainerStatus.RUNNING, TrainerFn.FITTING, RunningStage.TRAINING))

    data = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    trainer = tf.Trainer(accelerator="cpu", logger=False, max_epochs=1, callbacks=[Watch()], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), data)
    assert seen == [True, True]
    assert trainer.state == TrainerState(status=TrainerStatus.FINISHED) and TrainerState(TrainerStatus.FINISHED).finished


def test_a_keyboard_interrupt_in_a_hook_shuts_down_and_exits_with_status_1(tmp_path, caplog):
    import logging

    import pytest

    from tests.helpers import RegressionData, Regressor, quiet
    from torchfleet.callbacks import Callback, ModelCheckpoint

    seen = []

    class Interrupt(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.global_step == 3:
                raise KeyboardInterrupt

        def on_exception(self, trainer, module, exception):
            seen.append(type(exception).__name__)

    ck = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer = tf.Trainer(max_epochs=3, callbacks=[Interrupt(), ck], **quiet(enable_checkpointing=True))
    with caplog.at_level(logging.INFO, logger="torchfleet"), pytest.raises(SystemExit) as info:
        trainer.fit(Regressor(), datamodule=RegressionData())
    assert info.value.code == 1 and isinstance(info.value.__cause__, KeyboardInterrupt)  # as Lightning: sys.exit(1)
    assert trainer.interrupted and trainer.state.status == "interrupted"
    assert seen == ["KeyboardInterrupt"]  # the callbacks' on_exception ran first: the graceful part
    assert "Detected KeyboardInterrupt, attempting graceful shutdown" in caplog.text
    assert torch.load(tmp_path / "epoch=0-step=2.ckpt", weights_only=True)["global_step"] == 2  # the last good one
    # an evaluation stage ends the same way; an ordinary error is still raised as itself
    with pytest.raises(SystemExit):
        tf.Trainer(callbacks=[_RaiseOnTest(KeyboardInterrupt)], **quiet()).test(Regressor(), RegressionData())
    with pytest.raises(ValueError, match="not an interrupt"):
        tf.Trainer(callbacks=[_RaiseOnTest(ValueError("not an interrupt"))], **quiet()).test(Regressor(),
                                                                                            RegressionData())


class _RaiseOnTest(tf.callbacks.Callback):
    def __init__(self, exc):
        self.exc = exc

    def on_test_batch_start(self, *args):
        raise self.exc
