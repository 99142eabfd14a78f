"""Names ported Lightning code imports: torchfleet.Callback, torchfleet.utilities, torchfleet.plugins and the
demos (each trained briefly, its result checked against a plain evaluation)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import torchfleet
from tests.helpers import LogRecords, quiet
from torchfleet import Trainer
from torchfleet.demos import (
    BoringDataModule,
    BoringModel,
    LanguageModel,
    ManualOptimBoringModel,
    MNISTClassifier,
    MNISTDataModule,
    RandomDataset,
    RandomIterableDataset,
    SyntheticMNIST,
    WikiText2,
)
from torchfleet.utilities import rank_zero_debug, rank_zero_info, rank_zero_only, rank_zero_warn


def test_top_level_callback_and_plugins():
    from torchfleet.callbacks import Callback

    assert torchfleet.Callback is Callback
    from torchfleet.plugins import (
        AsyncCheckpointIO,
        CheckpointIO,
        MixedPrecision,
        Precision,
        TorchCheckpointIO,
    )
    from torchfleet.plugins.environments import LightningEnvironment, SLURMEnvironment

    assert issubclass(TorchCheckpointIO, CheckpointIO) and issubclass(AsyncCheckpointIO, CheckpointIO)
    assert issubclass(MixedPrecision, Precision)
    assert SLURMEnvironment is torchfleet.environments.SLURMEnvironment
    assert LightningEnvironment is torchfleet.environments.LocalEnvironment
    # a plugin from this module is taken by the Trainer
    trainer = Trainer(plugins=[TorchCheckpointIO()], **quiet())
    assert isinstance(trainer.strategy.checkpoint_io, TorchCheckpointIO)


def test_rank_zero_helpers(monkeypatch):
    calls = []

    @rank_zero_only
    def record(x):
        calls.append(x)
        return x

    assert rank_zero_only.rank == 0 and record(1) == 1
    with LogRecords() as messages, pytest.warns(UserWarning, match="careful"):
        rank_zero_info("hello %s", "there")
        rank_zero_warn("careful")
        rank_zero_debug("not shown at INFO")
    assert messages == ["hello there"]
    monkeypatch.setenv("RANK", "1")  # as torchrun sets it, before any process group exists
    assert rank_zero_only.rank == 1
    assert record(2) is None and calls == [1]
    with LogRecords() as messages, warnings.catch_warnings():
        warnings.simplefilter("error")
        rank_zero_info("hidden")
        rank_zero_warn("hidden")
    assert messages == []
    rank_zero_only.rank = 0  # set explicitly, as Lightning's strategies do
    try:
        assert record(3) == 3
    finally:
        rank_zero_only.rank = None
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert rank_zero_only.rank == 1


def test_banner_prints_on_rank_zero_only(capsys, monkeypatch):
    # ported examples call Lightning's cli_lightning_logo() before their CLI: the import line alone changes
    from torchfleet import cli_lightning_logo, cli_logo

    assert cli_lightning_logo is cli_logo
    cli_lightning_logo()
    out = capsys.readouterr().out
    assert torchfleet.__version__ in out and len(out.splitlines()) >= 5
    monkeypatch.setenv("RANK", "1")
    cli_logo()
    assert capsys.readouterr().out == ""


def test_boring_model_trains_and_every_stage_runs():
    torch.manual_seed(0)
    model = BoringModel()
    data = RandomDataset(32, 64).data
    before = model.loss(model(data)).item()
    trainer = Trainer(max_epochs=2, **quiet())
    trainer.fit(model)
    after = model.loss(model(data)).item()
    assert after < before / 2  # driven towards outputs of one
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0] == pytest.approx(0.1 * 0.1**2)
    preds = trainer.predict(model)
    assert len(preds) == 32 and preds[0].shape == (2, 2)
    trainer.test(model, datamodule=BoringDataModule())
    assert len(list(RandomIterableDataset(4, 5))) == 5


def test_manual_optim_boring_model():
    torch.manual_seed(0)
    model = ManualOptimBoringModel()
    start = model.layer.weight.detach().clone()
    trainer = Trainer(max_epochs=1, limit_train_batches=4, **quiet())
    trainer.fit(model)
    assert trainer.global_step == 4 and not torch.equal(start, model.layer.weight)


def test_mnist_demo_learns_the_synthetic_digits():
    torch.manual_seed(0)
    model = MNISTClassifier(hidden=32, lr=3e-3)
    trainer = Trainer(max_epochs=2, **quiet())
    trainer.fit(model, datamodule=MNISTDataModule(batch_size=64, train_size=2000, test_size=300))
    test = SyntheticMNIST(300, seed=1)
    with torch.no_grad():
        accuracy = (model(test.data).argmax(-1) == test.targets).float().mean().item()
    assert accuracy > 0.8  # chance is 0.1
    assert trainer.callback_metrics["val_acc"].item() > 0.8


def test_transformer_demo_learns_the_corpus():
    torch.manual_seed(0)
    data = WikiText2(block_size=16)
    model = LanguageModel(vocab_size=data.vocab_size, lr=3e-3, ninp=32, nhead=2, nhid=64, nlayers=1, dropout=0.0)
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    tokens, target = next(iter(torch.utils.data.DataLoader(data, batch_size=64)))
    with torch.no_grad():
        before = model.loss((tokens, target)).item()
    assert before == pytest.approx(math.log(data.vocab_size), rel=0.3)
    Trainer(max_epochs=2, **quiet()).fit(model, loader)
    with torch.no_grad():
        after = model.loss((tokens, target)).item()
    # the grammar leaves about log(6) nats at the word choices and nothing elsewhere: far below uniform guessing
    assert after < 0.5 * before
