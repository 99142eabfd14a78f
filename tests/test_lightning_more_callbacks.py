"""OnExceptionCheckpoint, BasePredictionWriter and GradientAccumulationScheduler: Lightning's numbers on one seeded
program (tests/lightning_more_programs.py), and what each guarantees checked without Lightning."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.helpers import FailsAt, Regressor, make_data, quiet
from tests.lightning_more_programs import source
from tests.lightning_reference import finish, needs_lightning, run_here, start_in_lightning
from torchfleet import Trainer
from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks import (
    BasePredictionWriter,
    GradientAccumulationScheduler,
    OnExceptionCheckpoint,
)


def _results(out: str) -> dict:
    return json.loads(out.split("RESULTS ", 1)[1])


@needs_lightning
def test_the_program_gives_lightnings_numbers_bitwise():
    # the same float32 operations in the same order on the CPU: nothing here allows a rounding difference
    theirs = start_in_lightning(source("lightning"))
    ours = _results(run_here(source("torchfleet")))
    theirs = _results(finish(theirs))
    # accumulation {1: 2, 3: 3} over 10 batches: 10, 5, 5 and 4 (3+3+3+1) steps
    assert ours["accumulation"]["epochs"] == theirs["accumulation"]["epochs"]
    assert ours["accumulation"]["losses"] == theirs["accumulation"]["losses"]
    assert ours["accumulation"]["weights"] == theirs["accumulation"]["weights"]
    assert ours["exception"] == theirs["exception"]
    assert ours["writer"] == theirs["writer"]


def _sgd_reference(model, batches, accumulate_by_epoch):
    """A plain loop: SGD(momentum) stepping once per window of ``n`` batches on the sum of loss/n gradients."""
    opt = torch.optim.SGD(model.parameters(), lr=model.hparams.lr, momentum=0.9)
    for n in accumulate_by_epoch:
        for i, (x, y) in enumerate(batches):
            (nn.functional.mse_loss(model(x), y) / n).backward()
            if (i + 1) % n == 0 or i + 1 == len(batches):
                opt.step()
                opt.zero_grad()
    return model.state_dict()


class _Steps(Regressor):
    def __init__(self):
        super().__init__()
        self.steps = []

    def on_train_epoch_end(self):
        self.steps.append(self.trainer.global_step)


def test_the_scheduled_accumulation_steps_as_a_plain_loop_does():
    torch.manual_seed(0)
    model, reference = _Steps(), Regressor()
    reference.load_state_dict(model.state_dict())
    data = DataLoader(make_data(56), batch_size=8)  # 7 batches
    Trainer(max_epochs=3, callbacks=[GradientAccumulationScheduler({1: 3, 2: 2})], **quiet()).fit(model, data)
    assert model.steps == [7, 7 + 3, 7 + 3 + 4]  # 3 windows of 3 (the last of 1), then 4 of 2 (the last of 1)
    expected = _sgd_reference(reference, list(data), [1, 3, 2])
    for name, value in expected.items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=1e-6)


@pytest.mark.parametrize("scheduling, words", [({}, "non-empty dict"), ({-1: 2}, "not ints >= 0"),
                                               ({0: 0}, "not ints >= 1"), ({1: 2.0}, "not ints >= 1")])
def test_a_bad_schedule_is_refused_in_one_paragraph(scheduling, words):
    with pytest.raises(ConfigurationError, match=words):
        GradientAccumulationScheduler(scheduling)


def test_the_schedule_and_the_trainers_own_accumulation_are_refused_together():
    trainer = Trainer(max_epochs=1, accumulate_grad_batches=2, callbacks=[GradientAccumulationScheduler({0: 2})],
                      **quiet())
    with pytest.raises(ConfigurationError, match="remove accumulate_grad_batches from the Trainer"):
        trainer.fit(Regressor(), DataLoader(make_data(16), batch_size=8))


def test_the_exception_checkpoint_resumes_to_the_uninterrupted_run(tmp_path):
    torch.manual_seed(0)
    failing, whole = FailsAt(step=5), Regressor()
    whole.load_state_dict(failing.state_dict())
    data = DataLoader(make_data(64), batch_size=8)
    callback = OnExceptionCheckpoint(tmp_path)
    with pytest.raises(RuntimeError, match="bad batch"):
        Trainer(max_epochs=2, callbacks=[callback], **quiet(enable_checkpointing=True)).fit(failing, data)
    assert os.listdir(tmp_path) == ["on_exception.ckpt"]
    assert torch.load(callback.ckpt_path, weights_only=True)["global_step"] == 5
    failing.fail_step = -1
    resumed = Trainer(max_epochs=2, callbacks=[OnExceptionCheckpoint(tmp_path)], **quiet(enable_checkpointing=True))
    resumed.fit(failing, data, ckpt_path=callback.ckpt_path)
    Trainer(max_epochs=2, **quiet()).fit(whole, data)
    assert resumed.global_step == 16
    for name, value in whole.state_dict().items():
        torch.testing.assert_close(failing.state_dict()[name], value, rtol=0, atol=0)
    assert os.listdir(tmp_path) == []  # the run that ended well removed it


def test_an_empty_filename_and_checkpointing_switched_off_are_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="filename=''"):
        OnExceptionCheckpoint(tmp_path, filename="")
    with pytest.raises(ConfigurationError, match="found `OnExceptionCheckpoint`"):
        Trainer(callbacks=[OnExceptionCheckpoint(tmp_path)], **quiet(enable_checkpointing=False))


class _Collect(BasePredictionWriter):
    def __init__(self, interval):
        super().__init__(interval)
        self.batches, self.epoch = [], None

    def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.batches.append((list(batch_indices), prediction))

    def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
        self.epoch = (predictions, batch_indices)


def test_the_writer_gets_each_samples_prediction_under_its_dataset_index():
    torch.manual_seed(0)
    model, dataset = Regressor(), make_data(21)
    writer = _Collect("batch_and_epoch")
    shuffled = DataLoader(dataset, batch_size=4, shuffle=True)  # indices are then not in order: the test sees them
    assert Trainer(callbacks=[writer], **quiet()).predict(model, shuffled, return_predictions=False) is None
    seen = [i for indices, _ in writer.batches for i in indices]
    assert sorted(seen) == list(range(21)) and seen != list(range(21))
    with torch.no_grad():
        for indices, prediction in writer.batches:
            torch.testing.assert_close(prediction, model(dataset.tensors[0][indices]))
    predictions, epoch_indices = writer.epoch
    assert epoch_indices == [[indices for indices, _ in writer.batches]]
    assert all(a is b for a, b in zip(predictions, [p for _, p in writer.batches]))


def test_a_bad_write_interval_is_refused_in_one_paragraph():
    with pytest.raises(ConfigurationError, match=r"write_interval='step'\) is not valid: it is one of"):
        BasePredictionWriter("step")
