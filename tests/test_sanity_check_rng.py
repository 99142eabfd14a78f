"""The sanity check draws no random numbers that training sees (Lightning runs it under ``isolate_rng``)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

import torchfleet as tf
from tests.helpers import RegressionData, Regressor, loader, make_data, quiet


class Recording(Regressor):
    def __init__(self) -> None:
        super().__init__(dropout=0.5)
        self.train_batches: list[torch.Tensor] = []
        self.sanity_batches = 0

    def training_step(self, batch, batch_idx):
        self.train_batches.append(batch[0].clone())
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        if self.trainer.sanity_checking:
            self.sanity_batches += 1
            torch.rand(3)  # a validation step that draws, as a sampled metric would
        super().validation_step(batch, batch_idx)


def _fit(sanity_steps: int) -> Recording:
    tf.seed_everything(5)
    model = Recording()
    trainer = tf.Trainer(**quiet(max_epochs=1, num_sanity_val_steps=sanity_steps))
    trainer.fit(model, DataLoader(make_data(32), batch_size=8, shuffle=True), loader(16, batch_size=4))
    return model


def test_shuffled_training_order_and_weights_do_not_depend_on_the_sanity_check():
    checked, unchecked = _fit(2), _fit(0)
    assert checked.sanity_batches == 2 and unchecked.sanity_batches == 0
    assert len(checked.train_batches) == 4
    assert all(torch.equal(a, b) for a, b in zip(checked.train_batches, unchecked.train_batches))
    for (name, a), b in zip(checked.state_dict().items(), unchecked.state_dict().values()):
        assert torch.equal(a, b), name


def _fit_continues(sanity_steps: int) -> tuple[dict, torch.Tensor]:
    tf.seed_everything(0, verbose=False)
    model = Regressor()
    trainer = tf.Trainer(**quiet(max_epochs=2, num_sanity_val_steps=sanity_steps))
    trainer.fit(model, RegressionData(shuffle=True))
    assert trainer.global_step == 16
    return model.state_dict(), torch.rand(3)


def test_a_shuffled_run_is_the_same_with_and_without_the_sanity_check():
    without, after_without = _fit_continues(0)
    with_check, after_with = _fit_continues(2)
    for name, value in without.items():
        assert torch.equal(value, with_check[name]), name
    assert torch.equal(after_without, after_with)
