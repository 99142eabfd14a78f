"""No loop without progress: a fit that cannot take a training step ends, as Lightning's does.

Each of these spun forever at 100% CPU before (fit_loop.py), so each test has a pytest timeout: a regression
fails in seconds instead of stalling the suite. What Lightning 2.6 does, checked with its own Trainer:
``limit_train_batches=0`` and an empty training loader skip training (the sanity check, ``on_fit_start`` and
``on_fit_end`` still run; ``on_train_start`` does not; the counters stay 0); ``configure_optimizers()``
returning None trains without an optimizer while ``global_step`` counts the steps (one per
``accumulate_grad_batches`` batches), so ``max_steps`` ends the fit.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from tests.helpers import Regressor, loader, quiet
from torchfleet import Trainer

pytestmark = pytest.mark.timeout(60)


class Recording(Regressor):
    """Counts its training steps and the hooks Lightning's comparison is about."""

    def __init__(self, optimizer: bool = True) -> None:
        super().__init__()
        self.optimizer = optimizer
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def training_step(self, batch, batch_idx):
        self._count("training_step")
        return super().training_step(batch, batch_idx)

    def on_fit_start(self):
        self._count("on_fit_start")

    def on_train_start(self):
        self._count("on_train_start")

    def on_validation_start(self):
        self._count("on_validation_start")

    def on_fit_end(self):
        self._count("on_fit_end")

    def configure_optimizers(self):
        return super().configure_optimizers() if self.optimizer else None


class Empty(IterableDataset):
    def __iter__(self):
        return iter(())


class Stream(IterableDataset):
    """Five (x, y) pairs, with no length."""

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(5):
            yield torch.randn(8, generator=g), torch.randn(1, generator=g)


@pytest.mark.parametrize("how", ["limit_train_batches=0", "empty loader"])
def test_no_training_batch_skips_training_with_a_warning(how):
    model = Recording()
    limit = 0 if how == "limit_train_batches=0" else 1.0
    train = loader(64, 8) if limit == 0 else DataLoader(loader(64).dataset, batch_size=8, sampler=[])
    trainer = Trainer(**quiet(max_steps=5, max_epochs=-1, limit_train_batches=limit, num_sanity_val_steps=2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    match = r"limit_train_batches=0\) leaves no training batch" if limit == 0 else "has no batches: fit skips training"
    with pytest.warns(UserWarning, match=match):
        trainer.fit(model, train, loader(16, 8))
    assert trainer.state.status == "finished"
    assert (trainer.global_step, trainer.current_epoch) == (0, 0)
    # as Lightning: the sanity check's validation and the fit hooks run, training's do not
    assert model.calls == {"on_fit_start": 1, "on_validation_start": 1, "on_fit_end": 1}
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_no_optimizer_counts_steps_until_max_steps():
    model = Recording(optimizer=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(**quiet(max_steps=5, max_epochs=-1))
    with pytest.warns(UserWarning, match=r"configure_optimizers\(\) returned None"):
        trainer.fit(model, loader(32, 8))  # 4 batches an epoch: the fit ends in its second epoch
    assert trainer.global_step == 5 and model.calls["training_step"] == 5
    assert trainer.current_epoch == 2  # as Lightning: the epoch that max_steps cut short counts as done
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_no_optimizer_counts_one_step_per_accumulation_window():
    model = Recording(optimizer=False)
    trainer = Trainer(**quiet(max_epochs=2, accumulate_grad_batches=2))
    with pytest.warns(UserWarning, match=r"configure_optimizers\(\) returned None"):
        trainer.fit(model, loader(32, 8))
    # Lightning gives global_step 2 for one epoch of 4 batches accumulated by 2
    assert trainer.global_step == 4 and model.calls["training_step"] == 8


def test_an_empty_loader_without_length_stops_the_fit_with_a_warning():
    model = Recording()
    trainer = Trainer(**quiet(max_steps=5, max_epochs=-1))
    with pytest.warns(UserWarning, match="gave no batch in epoch 0, so fit stops"):
        trainer.fit(model, DataLoader(Empty(), batch_size=None))
    assert trainer.global_step == 0 and trainer.current_epoch == 1
    assert "training_step" not in model.calls


def test_a_loader_without_length_validates_at_each_epoch_end():
    class Validations(Recording):
        def on_validation_epoch_end(self):
            self._count(f"validated after step {self.global_step}")

    model = Validations()
    trainer = Trainer(**quiet(max_epochs=2))
    trainer.fit(model, DataLoader(Stream(), batch_size=None), loader(16, 8))
    # as Lightning: the epoch ends when the stream runs out, and the epoch-end validation follows
    assert trainer.global_step == 10
    assert model.calls["validated after step 5"] == 1 and model.calls["validated after step 10"] == 1
    assert "val_loss" in trainer.callback_metrics


def test_a_loader_without_length_ends_its_accumulation_window_at_its_last_batch():
    seen = []

    class Last(Recording):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            seen.append((batch_idx, self.trainer.is_last_batch, self.global_step))

    trainer = Trainer(**quiet(max_epochs=2, accumulate_grad_batches=2))
    trainer.fit(Last(), DataLoader(Stream(), batch_size=None))
    # as Lightning: the 5th batch is known to be the last, so it steps with the 4th's window still open
    assert seen[:5] == [(0, False, 0), (1, False, 1), (2, False, 1), (3, False, 2), (4, True, 3)]
    assert trainer.global_step == 6
