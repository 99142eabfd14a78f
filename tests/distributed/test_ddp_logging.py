"""Logging and callbacks across 2 ranks: reductions, and decisions that every rank takes alike.

Runs under ddp_fork from the test process. A callback that decided differently on one rank
would leave the other waiting in a collective; the watcher would then fail the run, so a
clean finish with the expected epoch is the check.
"""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

import torchfleet as tf
from tests.distributed.scripts.ddp_train import make_data
from tests.distributed.scripts.logging_model import RankLogger, RankZeroWriter
from torchfleet.callbacks import EarlyStopping, ModelCheckpoint

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.forks
def test_sync_dist_reductions_and_rank_dependent_decisions(tmp_path):
    writes = tmp_path / "rank0.txt"
    early = EarlyStopping(monitor="local", mode="min", patience=0)
    best = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="zero_only", mode="min", save_top_k=1)
    trainer = tf.Trainer(strategy="ddp_fork", accelerator="cpu", devices=2, max_epochs=5, logger=False,
                         callbacks=[early, best, RankZeroWriter(str(writes))], enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    data = make_data()
    trainer.fit(RankLogger(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=8))
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # ranks 0 and 1 logged their rank: mean 0.5, sum 1, max 1, min 0 over the epoch and across ranks
    assert m["rank_mean"] == pytest.approx(0.5)
    # sum: each rank summed its 4 validation batches (32 samples / batch 8), then the ranks were added
    assert m["rank_sum"] == pytest.approx(4 * 1.0)
    assert (m["rank_max"], m["rank_min"]) == (1.0, 0.0)
    # rank 0's "local" improves every epoch and rank 1's never does; rank 0 decides for both -> no early stop
    assert trainer.current_epoch == 5 and early.stopped_epoch == 0
    # a value only rank 0 logs can be monitored: rank 0 broadcasts it
    assert best.best_model_path.endswith(".ckpt") and best.best_model_score == pytest.approx(6.0)
    assert writes.read_text().split() == ["0", "1", "2", "3", "4"]
    # collectives from the Module and the Trainer: a ragged gather gives [tensor([0.]), tensor([1., 1.])]
    assert m["ragged_total"] == 2.0 + 100 * 2
    assert m["reduced_sum"] == 3.0 and m["from_rank1"] == 17.0
    assert m["trainer_gather"] == 1.0 and m["trainer_max"] == 1.0


def test_rank_zero_only_with_sync_dist_is_refused():
    class Both(RankLogger):
        def validation_step(self, batch, batch_idx):
            self.log("x", 1.0, sync_dist=True, rank_zero_only=True)

    trainer = tf.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0)
    data = make_data()
    with pytest.raises(tf.ConfigurationError, match="Choose one of the two"):
        trainer.fit(Both(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=8))
