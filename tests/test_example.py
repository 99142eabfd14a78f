"""The bundled addition example: its data are right, it learns, and its accuracy metric is honest."""

from __future__ import annotations

import csv
import os

import torch

from torchfleet import Trainer, seed_everything
from torchfleet.examples.addition import (
    AdditionData,
    AdditionTransformer,
    decode,
    make_examples,
    sequence_length,
)


def test_examples_are_correct_sums():
    tokens = make_examples(50, digits=3, seed=0)
    assert tokens.shape == (50, sequence_length(3))
    for row in tokens:
        a, rest = decode(row, 3).split("+")
        b, c = rest.split("=")
        assert int(a) + int(b) == int(c)


def test_train_and_val_share_no_question():
    dm = AdditionData(digits=2, num_train=3000, num_val=200)
    dm.setup("fit")
    q = 2 * 2 + 1
    train = {tuple(r[:q].tolist()) for (r,) in dm.train_set}
    val = {tuple(r[:q].tolist()) for (r,) in dm.val_set}
    assert train.isdisjoint(val) and len(dm.train_set) <= 3000


def test_greedy_decoding_matches_the_exact_match_metric():
    torch.manual_seed(0)
    model = AdditionTransformer(digits=2, d_model=32, nhead=2, num_layers=1, dim_feedforward=64)
    tokens = make_examples(64, digits=2, seed=3)
    # make some answers right by construction: a model that copies nothing will get ~0, so compare the two ways
    logits = model._answer_logits(tokens)
    teacher_forced = (logits.argmax(-1) == tokens[:, model.answer_start:]).all(1)
    greedy = (model.generate(tokens[:, : model.answer_start]) == tokens).all(1)
    assert torch.equal(teacher_forced, greedy)


def test_short_training_run_learns_and_logs(tmp_path):
    seed_everything(0)
    model = AdditionTransformer(digits=2, d_model=64, nhead=4, num_layers=2, dim_feedforward=128, lr=3e-3)
    data = AdditionData(digits=2, num_train=4096, num_val=256, batch_size=128)
    trainer = Trainer(max_epochs=4, default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                      log_every_n_steps=8, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=data)
    rows = list(csv.DictReader(open(os.path.join(trainer.log_dir, "metrics.csv"))))
    losses = [float(r["train_loss"]) for r in rows if r.get("train_loss")]
    # uniform guessing of a digit costs ln(10) = 2.30 nats; the model must be well below that and improving
    assert losses[-1] < 1.75 and losses[-1] < losses[0]
    accs = [float(r["val_acc"]) for r in rows if r.get("val_acc")]
    assert len(accs) == 4 and all(0.0 <= a <= 1.0 for a in accs)
    assert trainer.checkpoint_callback.best_model_path
