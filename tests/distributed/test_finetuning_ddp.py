"""BackboneFinetuning under ddp on 2 real processes: the backbone, frozen when DistributedDataParallel wrapped the
model, stays identical on every rank once unfrozen (its gradients are averaged by the callback; Lightning 2.6.6
lets the copies drift apart)."""

from __future__ import annotations

import pytest
import torch

import torchfleet as tf
from tests.test_finetuning import MODEL, TORCHFLEET
from torchfleet.callbacks import BackboneFinetuning, Callback

pytestmark = [pytest.mark.distributed, pytest.mark.forks]


def _classifier() -> type:
    """tests/test_finetuning.py's model (a BatchNorm backbone and a linear head, SGD with a StepLR)."""
    namespace: dict = {}
    exec(compile(TORCHFLEET + MODEL, "finetuning_model", "exec"), namespace)
    return namespace["Classifier"]


class Spread(Callback):
    """The largest difference between the ranks' copies of each part, kept in buffers that come back to the parent."""

    def on_train_end(self, trainer, pl_module):
        for name, weight in (("backbone", pl_module.backbone[0].weight), ("head", pl_module.layer.weight)):
            copies = trainer.strategy.all_gather(weight.detach())
            getattr(pl_module, f"{name}_spread").fill_((copies[0] - copies[1]).abs().max())


def test_unfrozen_backbone_stays_in_sync_across_ranks():
    tf.seed_everything(0)
    model = _classifier()()
    model.register_buffer("backbone_spread", torch.tensor(-1.0))
    model.register_buffer("head_spread", torch.tensor(-1.0))
    before = model.backbone[0].weight.detach().clone()
    trainer = tf.Trainer(strategy="ddp_fork", devices=2, accelerator="cpu", max_epochs=3, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=1), Spread()])
    trainer.fit(model)
    assert model.head_spread.item() == 0.0
    assert model.backbone_spread.item() == 0.0
    assert not torch.equal(model.backbone[0].weight, before)  # it trained after epoch 1
