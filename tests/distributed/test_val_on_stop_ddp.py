"""A stop that min_steps held back validates first (as Lightning), on every rank together under ddp.

EarlyStopping asks to stop at the first epoch's end, min_steps=3 holds the run until the first batch of the
second epoch; there every rank validates (a collective inside validation_step would hang a rank that did not)
and then stops. Runs under ddp_fork from the test process.
"""

from __future__ import annotations

import pytest

import torchfleet as tf
from tests.helpers import Regressor, loader, quiet
from torchfleet.callbacks import EarlyStopping

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


class StepOfValidation(Regressor):
    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        # synced: a rank validating alone would hang here; the max says at which step the last validation ran
        self.log("val_at_step", float(self.trainer.global_step), reduce_fx="max", sync_dist=True, on_epoch=True)
        self.log("val_batches", 1.0, reduce_fx="sum", sync_dist=True, on_epoch=True)


@pytest.mark.forks
def test_an_allowed_stop_validates_on_every_rank_before_it_ends_the_epoch():
    stopper = EarlyStopping(monitor="train_loss", check_on_train_epoch_end=True, stopping_threshold=1e9)
    trainer = tf.Trainer(**quiet(strategy="ddp_fork", devices=2, max_epochs=3, min_steps=3, limit_train_batches=2,
                                 limit_val_batches=1, callbacks=[stopper]))
    trainer.fit(StepOfValidation(), loader(64, batch_size=8), loader(16, batch_size=8))
    assert trainer.state.status == "finished" and trainer.global_step == 3
    # the last validation ran at step 3 (the allowed stop, mid-epoch), one batch on each of the two ranks
    assert float(trainer.callback_metrics["val_at_step"]) == 3.0
    assert float(trainer.callback_metrics["val_batches"]) == 2.0
