"""RunState: the Trainer's run state in one object; its counters are the Trainer's public attributes."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf
from torchfleet.trainer.state import RunState, TrainerFn


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


def test_state_dict_round_trip_and_stage_start():
    state = RunState(current_epoch=3, global_step=40, progress={"epoch": 3, "batches_done": 5})
    saved = {**state.state_dict(), "rng": {"torch": None}}
    assert saved["loops"] == {"fit": {"epoch": 3, "batches_done": 5}}
    other = RunState()
    other.load_state_dict(saved)
    assert (other.current_epoch, other.global_step) == (3, 40)
    assert other.resume == {"loops": {"epoch": 3, "batches_done": 5}, "rng": {"torch": None}}
    other.should_stop = True
    other.start_stage("validate")
    assert other.stage == "validate" and not other.should_stop and other.resume is None and other.progress is None
    assert RunState().state_dict()["loops"] == {}


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
    assert trainer.state.progress["epoch_done"] and trainer.state.stage is None
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
