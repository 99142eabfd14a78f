"""A duration val_check_interval under ddp: the ranks' clocks differ, yet they validate together.

Each rank reads its own clock; if every rank decided alone, the rank whose time is up would wait in
validation's collectives for one that is still training. Runs under ddp_fork from the test process
with a fit-loop clock that advances on rank 1 only.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

import torchfleet as tf
from tests.helpers import Regressor, loader, quiet
from torchfleet.trainer import fit_loop as fit_loop_module

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

_clock = [0.0]


def _rank_dependent_clock() -> float:
    # rank 1 "runs" 10 s per call of the clock; rank 0's clock stands still
    if dist.is_initialized() and dist.get_rank() == 1:
        _clock[0] += 10.0
    return _clock[0]


class SyncedValidation(Regressor):
    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        # a collective inside validation: a rank validating alone would hang here
        self.log("val_count", 1.0, reduce_fx="sum", sync_dist=True, on_epoch=True)


@pytest.mark.forks
def test_duration_interval_validates_on_every_rank_together(monkeypatch):
    monkeypatch.setattr(fit_loop_module, "_now", _rank_dependent_clock)
    trainer = tf.Trainer(**quiet(strategy="ddp_fork", devices=2, max_epochs=1, val_check_interval="00:00:00:25",
                                 limit_val_batches=1))
    trainer.fit(SyncedValidation(), loader(64, batch_size=8), loader(16, batch_size=8))
    # rank 1's clock passes 25 s every third check: both ranks validated, one batch each, every time
    assert trainer.current_epoch == 1 and trainer.state.status == "finished"  # the children's run, seen here
    assert float(trainer.callback_metrics["val_count"]) == 2.0
