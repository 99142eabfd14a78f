"""``reload_dataloaders_every_n_epochs`` on 2 real processes: every rank asks for its loaders again at the same
epochs, each gets its shard of the new data, and the ranks agree again on the number of batches (a collective
that would hang if one rank reloaded and the other did not)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import torchfleet as tf
from torchfleet.demos.boring_classes import BoringModel, RandomDataset

pytestmark = [pytest.mark.distributed, pytest.mark.forks]


class Growing(BoringModel):
    """Training data that grow by 8 samples an epoch; records what each epoch of rank 0 trains on."""

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 16 + 8 * self.trainer.current_epoch), batch_size=2)

    def val_dataloader(self):
        return DataLoader(RandomDataset(32, 6 + 2 * self.trainer.current_epoch), batch_size=2)

    def on_train_epoch_start(self):
        if self.global_rank == 0:
            # rank 0's counts come back to the parent through the weights: stored in a buffer
            self.seen[self.current_epoch] = float(self.trainer.num_training_batches)

    def on_validation_epoch_start(self):
        if self.global_rank == 0 and not self.trainer.sanity_checking:
            self.seen_val[self.current_epoch] = float(self.trainer.num_val_batches[0])


def test_every_rank_reloads_its_shard_at_the_same_epochs():
    model = Growing()
    model.register_buffer("seen", torch.zeros(3))
    model.register_buffer("seen_val", torch.zeros(3))
    trainer = tf.Trainer(strategy="ddp_fork", accelerator="cpu", devices=2, max_epochs=3,
                         reload_dataloaders_every_n_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, hang_timeout=60)
    trainer.fit(model)
    # per rank: (16 + 8e) / 2 ranks / batch 2, and validation (6 + 2e) / 2 / 2 rounded up (exact evaluation)
    assert model.seen.tolist() == [4.0, 6.0, 8.0]
    assert model.seen_val.tolist() == [2.0, 2.0, 3.0]
    assert trainer.global_step == 18
