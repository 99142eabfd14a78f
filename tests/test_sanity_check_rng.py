"""The sanity check draws no random number that training would have drawn (Lightning runs it under isolate_rng):
a shuffled run ends the same with and without it, and training continues the generator where seeding left it."""

from __future__ import annotations

import torch

import torchfleet as tf
from tests.helpers import RegressionData, Regressor, quiet


def _fit(sanity_steps: int) -> tuple[dict, torch.Tensor]:
    tf.seed_everything(0, verbose=False)
    model = Regressor()
    trainer = tf.Trainer(**quiet(max_epochs=2, num_sanity_val_steps=sanity_steps))
    trainer.fit(model, RegressionData(shuffle=True))
    assert trainer.global_step == 16
    return model.state_dict(), torch.rand(3)


def test_a_shuffled_run_is_the_same_with_and_without_the_sanity_check():
    without, after_without = _fit(0)
    with_check, after_with = _fit(2)
    for name, value in without.items():
        assert torch.equal(value, with_check[name]), name
    assert torch.equal(after_without, after_with)
