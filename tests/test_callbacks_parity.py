"""Lightning 2.6 callback behaviours: save_on_exception, EarlyStoppingReason, TQDMProgressBar, RichProgressBar,
ModelSummary and RichModelSummary, in real Trainer runs."""

from __future__ import annotations

import io
import os

import pytest
import torch
from torch import nn

from tests.helpers import FailsAt, LogRecords, RegressionData, Regressor, make_data, quiet
from torchfleet import Trainer
from torchfleet.callbacks import (
    EarlyStopping,
    EarlyStoppingReason,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    RichModelSummary,
    RichProgressBar,
    TQDMProgressBar,
)
from torchfleet.errors import ConfigurationError


def _raw_sgd(model, steps):
    """The reference: the same SGD(momentum) steps in a plain PyTorch loop over the same (unshuffled) batches."""
    data = make_data(64, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=model.hparams.lr, momentum=0.9)
    for i in range(steps):
        x, y = data[i * 8:(i + 1) * 8]
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model.state_dict()


def test_save_on_exception_saves_the_reached_state_then_reraises(tmp_path):
    torch.manual_seed(0)
    model = FailsAt(step=3)
    reference = FailsAt(step=3)
    reference.load_state_dict(model.state_dict())
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", save_on_exception=True, save_last=True)
    trainer = Trainer(max_epochs=2, callbacks=[ck], **quiet(enable_checkpointing=True))
    with pytest.raises(RuntimeError, match="bad batch"):
        trainer.fit(model, datamodule=RegressionData(shuffle=False))
    assert sorted(os.listdir(tmp_path / "ck")) == ["epoch=0-step=3.ckpt", "last.ckpt"]  # no temp file left
    saved = torch.load(tmp_path / "ck" / "epoch=0-step=3.ckpt", weights_only=True)
    assert saved["global_step"] == 3 and saved["epoch"] == 0
    expected = _raw_sgd(reference, 3)
    for name, value in expected.items():
        torch.testing.assert_close(saved["state_dict"][name], value)


def test_without_save_on_exception_nothing_is_saved(tmp_path):
    ck = ModelCheckpoint(dirpath=tmp_path / "ck")
    with pytest.raises(RuntimeError, match="bad batch"):
        Trainer(max_epochs=1, callbacks=[ck], **quiet(enable_checkpointing=True)).fit(
            FailsAt(step=2), datamodule=RegressionData())
    assert not os.path.exists(tmp_path / "ck") or os.listdir(tmp_path / "ck") == []


class _Scripted(Regressor):
    def __init__(self, values):
        super().__init__()
        self.values = values

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", float(self.values[self.current_epoch]))


@pytest.mark.parametrize(("kwargs", "values", "reason", "epoch"), [
    ({"patience": 1}, [1.0, 1.5, 0.1], EarlyStoppingReason.PATIENCE_EXHAUSTED, 1),
    ({"divergence_threshold": 5.0}, [1.0, 9.0, 0.1], EarlyStoppingReason.DIVERGENCE_THRESHOLD, 1),
    ({"stopping_threshold": 0.5}, [1.0, 0.9, 0.2, 0.1], EarlyStoppingReason.STOPPING_THRESHOLD, 2),
    ({}, [1.0, float("inf"), 0.1], EarlyStoppingReason.NON_FINITE_METRIC, 1),
])
def test_early_stopping_reason(kwargs, values, reason, epoch):
    es = EarlyStopping(monitor="val_loss", **kwargs)
    assert es.stopping_reason is EarlyStoppingReason.NOT_STOPPED and es.stopping_reason_message is None
    Trainer(max_epochs=len(values), callbacks=[es], **quiet()).fit(_Scripted(values), datamodule=RegressionData())
    assert es.stopping_reason is reason and es.stopped_epoch == epoch
    assert "val_loss" in es.stopping_reason_message
    restored = EarlyStopping(monitor="val_loss")
    restored.load_state_dict(es.state_dict())
    assert restored.stopping_reason is reason and restored.stopping_reason_message == es.stopping_reason_message
    assert [r.name for r in EarlyStoppingReason] == ["NOT_STOPPED", "STOPPING_THRESHOLD", "DIVERGENCE_THRESHOLD",
                                                     "PATIENCE_EXHAUSTED", "NON_FINITE_METRIC"]


def test_early_stopping_not_triggered_keeps_not_stopped():
    es = EarlyStopping(monitor="val_loss", patience=3)
    Trainer(max_epochs=3, callbacks=[es], **quiet()).fit(_Scripted([1.0, 0.9, 0.8]), datamodule=RegressionData())
    assert es.stopping_reason is EarlyStoppingReason.NOT_STOPPED and es.stopping_reason_message is None


class _CountingTQDM(TQDMProgressBar):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.redraws: list[int] = []

    def _redraw(self, trainer):
        self.redraws.append(self._n)
        super()._redraw(trainer)


def test_tqdm_progress_bar_redraws_every_refresh_rate_batches(capsys):
    bar = _CountingTQDM(refresh_rate=3)
    assert isinstance(bar, ProgressBar)
    trainer = Trainer(max_epochs=1, callbacks=[bar], **quiet(enable_progress_bar=True, limit_val_batches=0))
    trainer.fit(Regressor(), datamodule=RegressionData())
    # 8 batches: after batches 3 and 6, then once more when the epoch ends (no validation, which redraws too)
    assert bar.redraws == [3, 6, 8]
    assert [c for c in trainer.callbacks if isinstance(c, ProgressBar)] == [bar]  # no second, default bar
    assert "Epoch 0" in capsys.readouterr().err


def test_tqdm_progress_bar_refresh_rate_zero_and_bad_values(capsys):
    bar = _CountingTQDM(refresh_rate=0)
    assert not bar.is_enabled
    Trainer(max_epochs=1, callbacks=[bar], **quiet(enable_progress_bar=True)).fit(Regressor(), datamodule=RegressionData())
    assert bar.redraws == [] and "Epoch 0" not in capsys.readouterr().err
    with pytest.raises(ConfigurationError, match=r"refresh_rate=-1"):
        TQDMProgressBar(refresh_rate=-1)


def test_rich_progress_bar_draws_epochs_and_metrics():
    out = io.StringIO()
    bar = RichProgressBar(refresh_rate=2, console_kwargs={"file": out, "width": 160, "force_terminal": False})
    trainer = Trainer(max_epochs=2, callbacks=[bar], **quiet(enable_progress_bar=True))
    trainer.fit(Regressor(), datamodule=RegressionData())
    text = out.getvalue()
    assert "Epoch 1" in text and "8/8" in text and "train_loss" in text and "step: 16" in text
    assert bar.progress is None  # stopped when the stage ended
    trainer.validate(Regressor(), datamodule=RegressionData())
    assert "Validation" in out.getvalue()
    with pytest.raises(ConfigurationError, match=r"refresh_rate='x'"):
        RichProgressBar(refresh_rate="x")


@pytest.fixture
def records():
    with LogRecords() as messages:
        yield messages


def _summaries(messages):
    return [m for m in messages if "total parameters" in m]


def test_model_summary_depth(records):
    model = Regressor()
    n_first = sum(p.numel() for p in model.net[0].parameters())  # 8 * 16 + 16
    Trainer(max_epochs=1, callbacks=[ModelSummary(max_depth=2)], **quiet(enable_model_summary=True)).fit(
        model, datamodule=RegressionData())
    (deep,) = _summaries(records)  # the callback's replaces the Trainer's own
    assert "net.0" in deep and "Linear" in deep and f"{n_first:,}" in deep and "net.3" in deep
    assert f"{sum(p.numel() for p in model.parameters()):,} total parameters" in deep
    records.clear()
    Trainer(max_epochs=1, **quiet(enable_model_summary=True)).fit(Regressor(), datamodule=RegressionData())
    (shallow,) = _summaries(records)
    assert "net" in shallow and "net.0" not in shallow
    records.clear()
    Trainer(max_epochs=1, callbacks=[ModelSummary(max_depth=0)], **quiet(enable_model_summary=True)).fit(
        Regressor(), datamodule=RegressionData())
    assert _summaries(records) == []
    with pytest.raises(ConfigurationError, match=r"max_depth=-2"):
        ModelSummary(max_depth=-2)


def test_rich_model_summary_prints_a_table():
    out = io.StringIO()
    model = Regressor()
    summary = RichModelSummary(max_depth=-1, console_kwargs={"file": out, "width": 160})
    Trainer(max_epochs=1, callbacks=[summary], **quiet()).fit(model, datamodule=RegressionData())
    text = out.getvalue()
    total = sum(p.numel() for p in model.parameters())
    assert f"Total params: {total:,}" in text and "net.3" in text and "Tanh" in text
