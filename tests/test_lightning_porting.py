"""What ported Lightning programs do that used to crash (issue 13): each as the ported code writes it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf
from tests.helpers import RegressionData, Regressor, loader, make_data, quiet
from torchfleet.errors import ConfigurationError, MisconfiguredModuleError
from torchfleet.loggers.base import Logger

try:
    import torchmetrics
except ImportError:  # a test extra
    torchmetrics = None
needs_torchmetrics = pytest.mark.skipif(torchmetrics is None, reason="torchmetrics is not installed (a test extra)")


class Recorder(Logger):
    def __init__(self) -> None:
        self.metrics: list[tuple[int | None, dict]] = []
        self.hparams: list[dict] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, dict(metrics)))

    def log_hyperparams(self, params):
        self.hparams.append(dict(params))


# ------------------------------------------------------------------ a DataModule in the dataloaders' place
def test_datamodule_given_positionally_to_every_entry_point():
    dm = RegressionData(shuffle=False)
    model = Regressor()
    trainer = tf.Trainer(**quiet(max_epochs=1))
    trainer.fit(model, dm)
    assert trainer.datamodule is dm and trainer.global_step == 8
    assert "val_loss" in trainer.validate(model, dm, verbose=False)[0]
    assert "test_loss" in trainer.test(model, dm, verbose=False)[0]

    class Predict(RegressionData):
        def predict_dataloader(self):
            return DataLoader(self.val, batch_size=8)

    preds = trainer.predict(model, Predict())
    assert torch.cat(preds).shape == (32, 1)


def test_datamodule_positionally_and_by_name_is_refused():
    dm = RegressionData()
    with pytest.raises(ConfigurationError, match=r"trainer\.fit\(\) got a RegressionData in the dataloaders' place"):
        tf.Trainer(**quiet(max_epochs=1)).fit(Regressor(), dm, datamodule=RegressionData())


# ------------------------------------------------------------------ steps without batch_idx
class NoBatchIdx(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(8, 1)

    def training_step(self, batch):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def test_step(self, batch):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x), y))

    def predict_step(self, batch):
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_steps_without_batch_idx_train_like_a_raw_loop():
    model = NoBatchIdx()
    trainer = tf.Trainer(**quiet(max_epochs=1))
    trainer.fit(model, loader(), loader(32))
    torch.manual_seed(0)
    net = nn.Linear(8, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in loader():
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    torch.testing.assert_close(model.net.weight, net.weight, rtol=0, atol=1e-6)
    x, y = make_data(32)[:]
    with torch.no_grad():
        want = nn.functional.mse_loss(net(x), y).item()
    assert trainer.validate(model, loader(32), verbose=False)[0]["val_loss"] == pytest.approx(want, rel=1e-5)
    assert trainer.test(model, loader(32), verbose=False)[0]["test_loss"] == pytest.approx(want, rel=1e-5)
    preds = torch.cat(trainer.predict(model, loader(32)))
    torch.testing.assert_close(preds, net(x).detach())


# ------------------------------------------------------------------ torchmetrics Metric objects in self.log
class Classifier(tf.Module):
    """As the lightning-hydra-template MNIST module: metrics as attributes, logged as objects."""

    def __init__(self, val_update: str = "forward") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 3)
        self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")
        self.val_update = val_update
        self.train_preds: list[torch.Tensor] = []
        self.val_preds: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.train_preds.append(logits.argmax(1).detach())
        self.train_acc(logits, y)
        self.log("train/acc", self.train_acc, on_step=True, on_epoch=True)
        return nn.functional.cross_entropy(logits, y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.val_preds.append(logits.argmax(1))
        if self.val_update == "forward":
            self.val_acc(logits, y)
        else:
            self.val_acc.update(logits, y)
        self.log("val/acc", self.val_acc)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def classes(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


@needs_torchmetrics
@pytest.mark.parametrize("val_update", ["forward", "update"])
def test_logged_metric_objects_give_step_values_and_their_own_epoch_compute_then_reset(val_update):
    train, val = classes(48, 0), classes(40, 1)
    model, rec = Classifier(val_update), Recorder()
    trainer = tf.Trainer(**quiet(max_epochs=2, logger=rec, log_every_n_steps=1))
    trainer.fit(model, DataLoader(train, batch_size=8), DataLoader(val, batch_size=16))
    ys = train.tensors[1]
    # per step: the accuracy of that batch (the metric's forward value)
    steps = [m["train/acc_step"] for _, m in rec.metrics if "train/acc_step" in m]
    want_steps = [(p == ys[(i % 6) * 8:(i % 6 + 1) * 8]).float().mean().item() for i, p in enumerate(model.train_preds)]
    assert steps == pytest.approx(want_steps)
    # per epoch: compute() over that epoch's batches only (the metric is reset between epochs)
    epochs = [m["train/acc_epoch"] for _, m in rec.metrics if "train/acc_epoch" in m]
    want_epochs = [torch.cat(model.train_preds[e * 6:(e + 1) * 6]).eq(ys).float().mean().item() for e in range(2)]
    assert epochs == pytest.approx(want_epochs)
    # validation's default is per epoch: 40 samples in batches of 16, 16, 8 (a mean of batch means would differ)
    vals = [m["val/acc"] for _, m in rec.metrics if "val/acc" in m]
    vy = val.tensors[1]
    want_vals = [torch.cat(model.val_preds[e * 3:(e + 1) * 3]).eq(vy).float().mean().item() for e in range(2)]
    assert vals == pytest.approx(want_vals)
    assert float(trainer.callback_metrics["val/acc"]) == pytest.approx(want_vals[-1])
    assert model.val_acc.update_count == 0 and model.train_acc.update_count == 0  # reset after each epoch


@needs_torchmetrics
def test_a_metric_logged_per_step_without_forward_is_explained():
    class UpdateOnly(Classifier):
        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            self.train_acc.update(logits, y)
            self.log("train/acc", self.train_acc)  # training logs per step by default
            return nn.functional.cross_entropy(logits, y)

    with pytest.raises(MisconfiguredModuleError, match=r"value of its last forward call.*on_step=False"):
        tf.Trainer(**quiet(max_epochs=1)).fit(UpdateOnly(), DataLoader(classes(16, 0), batch_size=8))


# ------------------------------------------------------------------ trainer.model
def test_trainer_model_is_the_module_on_one_device():
    model = Regressor()
    trainer = tf.Trainer(**quiet(max_epochs=1))
    assert trainer.model is None
    trainer.fit(model, loader())
    assert trainer.model is model


# ------------------------------------------------------------------ hyperparameters
class HDataModule(RegressionData):
    def __init__(self, n: int = 64, batch_size: int = 8, data_dir: str = "/tmp/x") -> None:
        super().__init__(n, batch_size, shuffle=False)
        self.save_hyperparameters()


def test_datamodule_save_hyperparameters_are_logged_with_the_modules():
    dm = HDataModule(batch_size=16)
    assert dm.hparams.batch_size == 16 and dm.hparams.data_dir == "/tmp/x" and dm.hparams_initial["n"] == 64
    rec = Recorder()
    tf.Trainer(**quiet(max_epochs=1, logger=rec)).fit(Regressor(hidden=4), dm)
    assert rec.hparams == [{"d_in": 8, "hidden": 4, "lr": 0.05, "dropout": 0.0, "scheduler": None,
                            "n": 64, "batch_size": 16, "data_dir": "/tmp/x"}]


def test_conflicting_module_and_datamodule_hyperparameters_are_refused():
    class Clash(Regressor):
        def __init__(self, batch_size: int = 4) -> None:
            super().__init__()
            self.save_hyperparameters()

    with pytest.raises(ConfigurationError, match="'batch_size' with different values"):
        tf.Trainer(**quiet(max_epochs=1, logger=Recorder())).fit(Clash(), HDataModule(batch_size=16))


def test_save_hyperparameters_logger_false_keeps_them_from_the_loggers_only(tmp_path):
    class Quiet(Regressor):
        def __init__(self, hidden: int = 4, secret: str = "s") -> None:
            super().__init__(hidden=hidden)
            self.save_hyperparameters(logger=False)

    model, rec = Quiet(), Recorder()
    trainer = tf.Trainer(**quiet(max_epochs=1, logger=rec, default_root_dir=tmp_path))
    trainer.fit(model, loader())
    assert rec.hparams == []  # as Lightning: the loggers are not asked at all
    assert model.hparams.secret == "s"
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    assert torch.load(tmp_path / "m.ckpt", weights_only=True)["hyper_parameters"]["secret"] == "s"


# ------------------------------------------------------------------ configure_model (issue 11)
class Configured(tf.Module):
    """No layers in __init__; no guard in configure_model: a second call would start from new weights."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.created: list[tuple] = []

    def configure_model(self):
        self.calls += 1
        torch.manual_seed(0)
        self.net = nn.Linear(8, 1)
        self.created.append((self.net.weight.device.type, self.net.weight.dtype))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y.to(self.net.weight.dtype))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x), y.to(self.net.weight.dtype)))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_configure_model_on_resume_creates_the_layers_once_then_loads_the_checkpoint(tmp_path):
    first = Configured()
    trainer = tf.Trainer(**quiet(max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path / "a"))
    trainer.fit(first, loader())
    (ckpt,) = (tmp_path / "a" / "checkpoints").glob("*.ckpt")
    # a new process's module: configure_model builds fresh layers once, then the checkpoint fills them
    resumed = Configured()
    again = tf.Trainer(**quiet(max_epochs=1, default_root_dir=tmp_path / "b"))
    again.validate(resumed, loader(), ckpt_path=str(ckpt), verbose=False)
    assert resumed.calls == 1
    torch.testing.assert_close(resumed.net.weight, first.net.weight, rtol=0, atol=0)
    more = tf.Trainer(**quiet(max_epochs=2, default_root_dir=tmp_path / "c"))
    more.fit(resumed, loader(), ckpt_path=str(ckpt))
    assert resumed.calls == 1 and more.current_epoch == 2 and more.global_step == 2 * trainer.global_step
    assert not torch.equal(resumed.net.weight, first.net.weight)  # trained on from there


@pytest.mark.parametrize(("precision", "dtype"), [("32-true", torch.float32), ("64-true", torch.float64)])
def test_configure_model_runs_once_per_module_inside_the_creation_context(precision, dtype):
    model = Configured()
    trainer = tf.Trainer(**quiet(max_epochs=1, precision=precision))
    trainer.fit(model, loader())
    trainer.test(model, loader(32), verbose=False)
    trainer.fit(model, loader())  # a second fit continues from the trained layers
    assert model.calls == 1
    assert model.created == [("cpu", dtype)]  # created in the precision's dtype, not converted afterwards
    torch.manual_seed(0)
    net = nn.Linear(8, 1, dtype=dtype)  # initialised in that dtype, as the creation context does
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(2):
        for x, y in loader():
            nn.functional.mse_loss(net(x.to(dtype)), y.to(dtype)).backward()
            opt.step()
            opt.zero_grad()
    torch.testing.assert_close(model.net.weight.detach(), net.weight.detach(), rtol=0, atol=1e-6)
