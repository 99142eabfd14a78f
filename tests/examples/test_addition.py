"""The bundled addition example: right data, an honest accuracy metric, a schedule, and a short run that learns."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from torchfleet import Trainer, seed_everything
from torchfleet.cli import _metric_rows
from torchfleet.errors import ConfigurationError
from torchfleet.examples.addition import (
    EQUALS,
    PLUS,
    AdditionData,
    AdditionTransformer,
    decode,
    default_trainer_kwargs,
    make_examples,
    sequence_length,
)


def _tiny_model(digits: int = 2, **kwargs) -> AdditionTransformer:
    return AdditionTransformer(digits=digits, d_model=32, nhead=2, num_layers=1, dim_feedforward=64, **kwargs)


def test_examples_are_correct_sums_in_the_documented_layout():
    digits = 3
    tokens = make_examples(200, digits=digits, seed=0)
    assert tokens.shape == (200, sequence_length(digits)) == (200, 12)
    assert (tokens[:, digits] == PLUS).all() and (tokens[:, 2 * digits + 1] == EQUALS).all()
    assert tokens[:, 2 * digits + 2 :].max() <= 9
    for row in tokens:
        a, rest = decode(row, digits).split("+")
        b, c = rest.split("=")
        assert int(a) + int(b) == int(c)
    # answers are stored least significant digit first: the first answer token is (a + b) mod 10
    a = int("".join(map(str, tokens[0, :digits].tolist())))
    b = int("".join(map(str, tokens[0, digits + 1 : 2 * digits + 1].tolist())))
    assert tokens[0, 2 * digits + 2].item() == (a + b) % 10


def test_data_are_deterministic_from_the_seed():
    first, again, other = (AdditionData(digits=2, num_train=500, num_val=50, seed=s) for s in (7, 7, 8))
    for dm in (first, again, other):
        dm.setup("fit")
    assert torch.equal(first.train_set.tensors[0], again.train_set.tensors[0])
    assert torch.equal(first.val_set.tensors[0], again.val_set.tensors[0])
    assert not torch.equal(first.train_set.tensors[0], other.train_set.tensors[0])


def test_train_and_val_share_no_question():
    # 2 digits: 10^4 questions, so a 3000-example draw overlaps a 300-example validation set by chance
    digits, q = 2, 2 * 2 + 1
    dm = AdditionData(digits=digits, num_train=3000, num_val=300)
    dm.setup("fit")
    val = {tuple(r[:q].tolist()) for r in dm.val_set.tensors[0]}
    raw = {tuple(r[:q].tolist()) for r in make_examples(3300, digits, dm.seed)}
    assert raw & val, "the draw must overlap for this test to check the filtering"
    train = {tuple(r[:q].tolist()) for r in dm.train_set.tensors[0]}
    assert train.isdisjoint(val)
    assert len(dm.train_set) == 3000 and len(dm.val_set) == 300


def test_dataloaders_batch_tensors():
    dm = AdditionData(digits=2, num_train=100, num_val=30, batch_size=16)
    dm.setup("fit")
    (batch,) = next(iter(dm.train_dataloader()))
    assert batch.shape == (16, sequence_length(2)) and batch.dtype == torch.int64
    assert sum(len(b) for (b,) in dm.val_dataloader()) == 30


@pytest.mark.parametrize("digits", [0, 10, 2.0, True])
def test_bad_digit_counts_are_refused(digits):
    with pytest.raises(ConfigurationError, match="digits"):
        AdditionData(digits=digits)
    with pytest.raises(ConfigurationError, match="digits"):
        AdditionTransformer(digits=digits)


def test_a_validation_set_that_takes_every_question_is_refused():
    dm = AdditionData(digits=1, num_train=50, num_val=2000)
    with pytest.raises(ConfigurationError, match="no training example"):
        dm.setup("fit")


def test_model_refuses_data_made_for_another_digit_count():
    model = _tiny_model(digits=4)
    with pytest.raises(ConfigurationError, match="--data.digits"):
        model.training_step((make_examples(8, digits=3, seed=0),), 0)


def test_exact_match_metric_agrees_with_greedy_decoding():
    torch.manual_seed(0)
    digits = 2
    model = _tiny_model(digits).eval()
    tokens = make_examples(64, digits, seed=3)
    questions = tokens[:, : model.answer_start]
    # half the rows get the model's own greedy answer, so exactly those must count as right
    tokens[::2] = model.generate(questions[::2])
    greedy_right = (model.generate(questions) == tokens).all(dim=1)
    with torch.no_grad():
        logits = model._answer_logits(tokens)
    forced_right = (logits.argmax(-1) == tokens[:, model.answer_start :]).all(dim=1)
    assert greedy_right[::2].all() and forced_right[::2].all()
    assert torch.equal(forced_right, greedy_right)


def test_optimizer_warms_up_then_decays():
    model = _tiny_model(lr=1e-2)
    model.trainer = SimpleNamespace(estimated_stepping_batches=100)
    config = model.configure_optimizers()
    opt, sched = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert isinstance(opt, torch.optim.AdamW) and config["lr_scheduler"]["interval"] == "step"
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    peak = max(range(100), key=lrs.__getitem__)
    assert 0 < peak < 50 and lrs[0] < lrs[peak] / 10 and lrs[-1] < lrs[peak] / 100
    assert lrs[peak] == pytest.approx(1e-2, rel=0.05)
    # without a known step count there is no schedule to fit, only the optimizer
    model.trainer = SimpleNamespace(estimated_stepping_batches=float("inf"))
    assert isinstance(model.configure_optimizers(), torch.optim.AdamW)


def test_default_trainer_kwargs_are_trainer_arguments(tmp_path):
    kwargs = default_trainer_kwargs()
    assert kwargs["max_epochs"] >= 1
    Trainer(default_root_dir=tmp_path, **kwargs)  # raises on an argument the Trainer does not take


def _frequency_only_loss(answers: torch.Tensor) -> float:
    """Cross-entropy of a model that knows each answer position's digit frequencies but not the question."""
    entropies = []
    for position in answers.T:
        p = torch.bincount(position, minlength=10).double() / len(position)
        p = p[p > 0]
        entropies.append(-(p * p.log()).sum().item())
    return sum(entropies) / len(entropies)


@pytest.fixture
def one_thread():
    # a tiny model gains nothing from a second thread, and two spinning threads crawl when the CPU is shared
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_short_training_run_learns_and_logs(tmp_path, one_thread):
    seed_everything(0)
    digits = 2
    model = AdditionTransformer(digits=digits, d_model=64, nhead=4, num_layers=2, dim_feedforward=128, lr=3e-3)
    data = AdditionData(digits=digits, num_train=4096, num_val=256, batch_size=64)
    trainer = Trainer(max_epochs=2, default_root_dir=tmp_path, enable_progress_bar=False,
                      enable_model_summary=False, log_every_n_steps=8, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=data)
    assert trainer.global_step == 2 * 4096 // 64
    rows, _ = _metric_rows(trainer.log_dir)  # the default logger's: TensorBoard's events, or metrics.csv
    losses = [float(r["train_loss"]) for r in rows if r.get("train_loss")]
    assert len(losses) >= 12 and sum(losses[-3:]) < sum(losses[:3])
    accs = [float(r["val_acc"]) for r in rows if r.get("val_acc")]
    val_losses = [float(r["val_loss"]) for r in rows if r.get("val_loss")]
    assert len(accs) == len(val_losses) == 2 and all(0.0 <= a <= 1.0 for a in accs)
    # below what digit frequencies alone give (about 1.77 nats here): the model reads the question
    baseline = _frequency_only_loss(data.val_set.tensors[0][:, model.answer_start :])
    assert val_losses[-1] < baseline - 0.1
    assert "val_acc" in trainer.callback_metrics and trainer.checkpoint_callback.best_model_path
    # the checkpoint rebuilds the same model from its saved hyperparameters
    restored = AdditionTransformer.load_from_checkpoint(trainer.checkpoint_callback.best_model_path)
    assert restored.hparams.d_model == 64 and restored.hparams.digits == digits
    tokens = data.val_set.tensors[0][:32]
    with torch.no_grad():
        assert torch.allclose(restored(tokens), model(tokens), atol=1e-6)
