"""Ported-Lightning patterns under ddp and fsdp (issue 13), driven by a JSON argument; one launch runs them all.

Every run is one entry of ``cfg["runs"]`` with a ``kind``:

- ``"fit_test"``: ``trainer.fit(model)`` then ``trainer.test``, ``validate`` and ``predict`` with the same module
  (``strategy``: "ddp" or "fsdp"); records the weights after fit and the evaluation results.
- ``"gan"``: a GAN in manual optimisation (generator and discriminator losses, each with its own
  ``manual_backward`` and optimizer, ``toggle_optimizer``) under ``strategy`` (ddp options in ``ddp``).
- ``"sync_bn"``: one training step of a BatchNorm model with ``Trainer(sync_batchnorm=...)``; records the
  running statistics.
- ``"metric"``: ``trainer.validate`` of a classifier that logs a torchmetrics accuracy object (40 samples, an
  uneven split for some batch sizes); records the logged value and the model's weights.
- ``"configure_model"``: a model whose layers are created in ``configure_model``; fit, then test with the same
  module; records the calls, where the layers were created, the weights at the start of training and at the end.

The data is ``GLOBAL_BATCH`` samples a step at any world size (``GLOBAL_BATCH / world size`` per rank, shuffle
off), so a one-process run with the global batch is the reference. Rank 0 writes ``cfg["out"]``.
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf

try:
    from tests.distributed.scripts.fsdp_train import full_weights
except ImportError:  # run as a script from its folder
    from fsdp_train import full_weights  # type: ignore[no-redef]

GLOBAL_BATCH, N = 8, 32
D_IN, D_Z = 6, 4


def regression_data(n: int = N, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D_IN, generator=g)
    return TensorDataset(x, x @ torch.randn(D_IN, 1, generator=g))


def gan_data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(N, D_IN, generator=g) * 0.5 + 1.0, torch.randn(N, D_Z, generator=g))


class Regressor(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(D_IN, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class GAN(tf.Module):
    """Lightning's basic GAN example, reduced: one training_step steps both optimizers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.generator = nn.Sequential(nn.Linear(D_Z, 8), nn.Tanh(), nn.Linear(8, D_IN))
        self.discriminator = nn.Sequential(nn.Linear(D_IN, 8), nn.Tanh(), nn.Linear(8, 1))
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        real, z = batch
        opt_g, opt_d = self.optimizers()
        ones, zeros = torch.ones(len(z), 1), torch.zeros(len(z), 1)
        bce = nn.functional.binary_cross_entropy_with_logits
        self.toggle_optimizer(opt_g)
        g_loss = bce(self.discriminator(self.generator(z)), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        fake = self.generator(z).detach()
        d_loss = (bce(self.discriminator(real), ones) + bce(self.discriminator(fake), zeros)) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)

    def configure_optimizers(self):
        return (torch.optim.SGD(self.generator.parameters(), lr=0.2),
                torch.optim.SGD(self.discriminator.parameters(), lr=0.2))


class BatchNormModel(Regressor):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D_IN, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 1))


class ConfiguredModel(Regressor):
    """Lightning >= 2.1's configure_model: no layers until the Trainer calls it."""

    def __init__(self) -> None:
        tf.Module.__init__(self)
        self.configure_calls = 0
        self.created_on: list[str] = []
        self.start_weights = None

    def configure_model(self):
        self.configure_calls += 1
        if hasattr(self, "net"):
            return
        torch.manual_seed(0)  # as Regressor: the same initial weights (unless created on meta)
        self.net = nn.Sequential(nn.Linear(D_IN, 16), nn.Tanh(), nn.Linear(16, 1))
        self.created_on.append(str(self.net[0].weight.device))

    def on_train_start(self):
        from torch.distributed.tensor import DTensor

        self.start_weights = full_weights(self)
        weight = self.net[0].weight
        self.sharding = (isinstance(weight, DTensor), (weight.to_local() if isinstance(weight, DTensor) else weight).numel())


class SeenInTraining(tf.Callback):
    """What the strategy ran during fit (its teardown releases the wrappers when the stage ends)."""

    def __init__(self) -> None:
        self.seen: dict = {}

    def on_train_end(self, trainer, pl_module):
        self.seen = {"model": type(trainer.model).__name__, "second_layer": type(pl_module.net[1]).__name__}


def trainer_for(strategy, devices: int, **kw) -> tf.Trainer:
    return tf.Trainer(strategy=strategy, accelerator="cpu", devices=devices, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **kw)


def make_strategy(run: dict):
    if run.get("ddp"):
        from torchfleet.strategies import DDPStrategy

        return DDPStrategy(**run["ddp"])
    return run["strategy"]


def fit_test(run: dict, devices: int) -> dict:
    seen = SeenInTraining()
    trainer = trainer_for(run["strategy"], devices, max_epochs=2, callbacks=[seen])
    model = Regressor()
    batch = GLOBAL_BATCH // devices
    train = DataLoader(regression_data(), batch_size=batch)
    evaluate = DataLoader(regression_data(16, seed=1), batch_size=batch)
    trainer.fit(model, train)
    weights = full_weights(model)
    wrapped = {"during_fit": seen.seen["model"], "after_fit": type(trainer.model).__name__}
    test = trainer.test(model, evaluate, verbose=False)[0]["test_loss"]
    val = trainer.validate(model, evaluate, verbose=False)[0]["val_loss"]
    preds = torch.cat(trainer.predict(model, evaluate))
    return {"weights": weights, "test_loss": test, "val_loss": val, "preds": trainer.all_gather(preds).cpu(),
            "global_step": trainer.global_step, "model_type": wrapped,
            "weights_after_eval": full_weights(model)}


def gan(run: dict, devices: int) -> dict:
    trainer = trainer_for(make_strategy(run), devices, max_epochs=2)
    model = GAN()
    trainer.fit(model, DataLoader(gan_data(), batch_size=GLOBAL_BATCH // devices))
    return {"weights": full_weights(model), "global_step": trainer.global_step}


def sync_bn(run: dict, devices: int) -> dict:
    seen = SeenInTraining()
    trainer = trainer_for(run["strategy"], devices, max_steps=1, sync_batchnorm=run["sync"], callbacks=[seen])
    model = BatchNormModel()
    trainer.fit(model, DataLoader(regression_data(), batch_size=GLOBAL_BATCH // devices))
    bn = model.net[1]
    return {"running_mean": bn.running_mean.clone(), "running_var": bn.running_var.clone(),
            "bn_type": seen.seen["second_layer"], "bn_type_after_fit": type(bn).__name__, "weights": full_weights(model),
            "gathered_mean": trainer.all_gather(bn.running_mean.clone()).cpu()}


def configure_model(run: dict, devices: int) -> dict:
    trainer = trainer_for(run["strategy"], devices, max_epochs=1)
    model = ConfiguredModel()
    batch = GLOBAL_BATCH // devices
    trainer.fit(model, DataLoader(regression_data(), batch_size=batch))
    calls_after_fit = model.configure_calls
    test = trainer.test(model, DataLoader(regression_data(16, seed=1), batch_size=batch), verbose=False)
    return {"calls_after_fit": calls_after_fit, "calls": model.configure_calls, "created_on": model.created_on,
            "start_weights": model.start_weights, "weights": full_weights(model), "test_loss": test[0]["test_loss"],
            "sharded": model.sharding[0], "local_numel": model.sharding[1]}


class MetricClassifier(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        import torchmetrics

        torch.manual_seed(0)
        self.net = nn.Linear(D_IN, 3)
        self.acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.acc.update(self.net(x), y)
        self.log("val_acc", self.acc)


def classes(n: int = 42) -> TensorDataset:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, D_IN, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.3).long())


def metric(run: dict, devices: int) -> dict:
    trainer = trainer_for(run["strategy"], devices)
    model = MetricClassifier()
    out = trainer.validate(model, DataLoader(classes(), batch_size=4), verbose=False)
    return {"val_acc": out[0]["val_acc"], "weights": full_weights(model)}


KINDS = {"fit_test": fit_test, "gan": gan, "sync_bn": sync_bn, "configure_model": configure_model, "metric": metric}


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    devices = cfg.get("devices", 2)
    results = {}
    for run in cfg["runs"]:
        tf.seed_everything(0)
        results[run["name"]] = KINDS[run["kind"]](run, devices)
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        torch.save(results, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
