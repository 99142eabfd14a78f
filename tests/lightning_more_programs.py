"""Seeded programs using Lightning's OnExceptionCheckpoint, BasePredictionWriter, GradientAccumulationScheduler and
Tuner.lr_find,
written once and run under torchfleet or (their import lines turned back) under Lightning 2.6.6; each prints
``RESULTS <json>``. Used by tests/test_lightning_more_callbacks.py and tests/test_tuner.py."""

from __future__ import annotations

TORCHFLEET = """
from torchfleet import Trainer, seed_everything
from torchfleet import Module as LightningModule
from torchfleet.trainer.callbacks import BasePredictionWriter, GradientAccumulationScheduler, OnExceptionCheckpoint
from torchfleet.loggers import Logger
from torchfleet.trainer.callbacks import DeviceStatsMonitor, StochasticWeightAveraging
from torchfleet.tuner import Tuner
"""

LIGHTNING = """
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import BasePredictionWriter, GradientAccumulationScheduler, OnExceptionCheckpoint
from lightning.pytorch.callbacks import DeviceStatsMonitor, StochasticWeightAveraging
from lightning.pytorch.loggers import Logger
from lightning.pytorch.tuner import Tuner
"""

COMMON = """
import json, os, tempfile
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, 0.5 * x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g))
"""

CALLBACKS = """

class Net(LightningModule):
    def __init__(self, fail_at=-1):
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
        self.fail_at, self.losses, self.epochs = fail_at, [], {}

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        if self.global_step == self.fail_at:
            raise RuntimeError("stop here")
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.losses.append(loss.item())
        return loss

    def on_train_epoch_end(self):
        self.epochs[self.current_epoch] = [self.trainer.global_step, self.trainer.accumulate_grad_batches]

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Writer(BasePredictionWriter):
    def __init__(self, interval):
        super().__init__(interval)
        self.batches, self.epoch = [], None

    def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.batches.append([batch_idx, dataloader_idx, list(batch_indices), prediction.squeeze(1).tolist()])

    def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
        nested = predictions and isinstance(predictions[0], list)
        self.epoch = {"predictions": [[p.squeeze(1).tolist() for p in per] for per in predictions] if nested
                      else [p.squeeze(1).tolist() for p in predictions], "indices": batch_indices}


def trainer(**kw):
    kw.setdefault("enable_checkpointing", False)
    return Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                   num_sanity_val_steps=0, **kw)


def weights(module):
    return [p.detach().flatten().tolist() for p in module.parameters()]


results = {}

seed_everything(7)
model = Net()
trainer(max_epochs=4, callbacks=[GradientAccumulationScheduler({1: 2, 3: 3})]).fit(
    model, DataLoader(data(40, 0), batch_size=4, shuffle=True))
results["accumulation"] = {"epochs": model.epochs, "losses": model.losses, "weights": weights(model)}

folder = tempfile.mkdtemp()
seed_everything(3)
model = Net(fail_at=5)
try:
    trainer(max_epochs=3, callbacks=[OnExceptionCheckpoint(folder)], enable_checkpointing=True).fit(model, DataLoader(data(32, 1), batch_size=4))
except RuntimeError:
    pass
saved = torch.load(os.path.join(folder, "on_exception.ckpt"), weights_only=False)
clean = tempfile.mkdtemp()
seed_everything(3)
trainer(max_epochs=1, callbacks=[OnExceptionCheckpoint(clean, filename="x")], enable_checkpointing=True).fit(
    Net(), DataLoader(data(32, 1), batch_size=4))
results["exception"] = {"files": sorted(os.listdir(folder)), "epoch": saved["epoch"],
                        "global_step": saved["global_step"], "left_after_success": os.listdir(clean),
                        "state_dict": {k: v.flatten().tolist() for k, v in saved["state_dict"].items()}}

seed_everything(5)
model = Net()
both = Writer("batch_and_epoch")
returned = trainer(callbacks=[both]).predict(
    model, [DataLoader(data(10, 2), batch_size=3), DataLoader(data(7, 3), batch_size=4)], return_predictions=False)
epoch_only = Writer("epoch")
kept = trainer(callbacks=[epoch_only]).predict(model, DataLoader(data(9, 4), batch_size=2))
results["writer"] = {"batches": both.batches, "epoch": both.epoch, "returned": returned,
                     "single": epoch_only.epoch, "kept": [p.squeeze(1).tolist() for p in kept]}

print("RESULTS", json.dumps(results))
"""


#: Tuner.lr_find, then a fit with the rate it found
LR_FIND = """
class Net(LightningModule):
    def __init__(self, lr=0.01):
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


seed_everything(11)
model = Net()
trainer = Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_progress_bar=False,
                  enable_model_summary=False, enable_checkpointing=False)
train = DataLoader(data(64, 0), batch_size=4, shuffle=True)
val = DataLoader(data(16, 1), batch_size=8)
finder = Tuner(trainer).lr_find(model, train, val, num_training=40)
results = {"lr": finder.results["lr"], "loss": finder.results["loss"], "suggestion": finder.suggestion(),
           "hparams_lr": model.hparams.lr}
trainer.fit(model, train, val)
results["weights"] = [p.detach().flatten().tolist() for p in model.parameters()]
results["next_random"] = torch.rand(2).tolist()
print("RESULTS", json.dumps(results))
"""

#: Tuner.scale_batch_size in both modes on a model whose training step fails as torch does when out of memory above
#: 48 samples, then a fit with the size found
BATCH_SIZE = """
class Sized(LightningModule):
    def __init__(self, batch_size=16):
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        self.tried = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.tried.append(len(x))
        if len(x) > 48:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return nn.functional.mse_loss(self.layer(x), y)

    def train_dataloader(self):
        return DataLoader(data(300, 0), batch_size=self.hparams.batch_size, shuffle=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


results = {}
for mode in ("power", "binsearch"):
    seed_everything(4)
    model = Sized()
    trainer = Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)
    found = Tuner(trainer).scale_batch_size(model, mode=mode)
    tried, model.tried = model.tried, []
    trainer.fit(model)
    results[mode] = {"found": found, "hparams": model.hparams.batch_size, "tried": tried, "fit_batches": model.tried,
                     "weights": [p.detach().flatten().tolist() for p in model.parameters()],
                     "next_random": torch.rand(2).tolist()}
print("RESULTS", json.dumps(results))
"""

#: StochasticWeightAveraging from epoch 3 of 6 after a StepLR, with the averaged weights and the rate every epoch
SWA = """
class Averaged(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
        self.rates, self.starts = [], []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def on_train_epoch_start(self):
        self.rates.append(self.trainer.optimizers[0].param_groups[0]["lr"])
        self.starts.append([p.detach().flatten().tolist() for p in self.parameters()])

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)]


results = {}
for strategy in ("cos", "linear"):
    seed_everything(9)
    model = Averaged()
    swa = StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=3, annealing_epochs=2, annealing_strategy=strategy)
    trainer = Trainer(accelerator="cpu", max_epochs=6, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, callbacks=[swa])
    trainer.fit(model, DataLoader(data(48, 2), batch_size=8, shuffle=True))
    results[strategy] = {"rates": model.rates, "starts": model.starts, "n_averaged": int(swa.n_averaged),
                         "final": [p.detach().flatten().tolist() for p in model.parameters()]}
print("RESULTS", json.dumps(results))
"""

#: under ddp on 2 processes (a script each rank runs; each writes ranks-<rank>.json in the folder of argv[1]): the
#: scheduled accumulation, a prediction writer's shards and stochastic weight averaging, in one launch
DDP = """
import sys


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
        self.epochs = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def on_train_epoch_end(self):
        self.epochs.append(self.trainer.global_step)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Writer(BasePredictionWriter):
    def __init__(self):
        super().__init__("batch_and_epoch")
        self.batches, self.epoch = [], None

    def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.batches.append([list(batch_indices), prediction.squeeze(1).tolist()])

    def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
        self.epoch = [batch_indices, [p.squeeze(1).tolist() for p in predictions]]


def trainer(**kw):
    return Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0, **kw)


def weights(module):
    return [p.detach().flatten().tolist() for p in module.parameters()]


results = {}
seed_everything(7)
model = Net()
trainer(max_epochs=3, callbacks=[GradientAccumulationScheduler({1: 2, 2: 3})]).fit(
    model, DataLoader(data(40, 0), batch_size=4, shuffle=True))
results["accumulation"] = {"epochs": model.epochs, "weights": weights(model)}
writer = Writer()
run = trainer(callbacks=[writer])
run.predict(model, DataLoader(data(13, 3), batch_size=3), return_predictions=False)
results["writer"] = {"batches": writer.batches, "epoch": writer.epoch}
seed_everything(9)
model = Net()
swa = StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2, annealing_epochs=1)
trainer(max_epochs=4, callbacks=[swa]).fit(model, DataLoader(data(48, 2), batch_size=8, shuffle=True))
results["swa"] = {"weights": weights(model), "n_averaged": int(swa.n_averaged)}
with open(os.path.join(sys.argv[1], f"ranks-{run.global_rank}.json"), "w") as f:
    json.dump(results, f)
"""

#: DeviceStatsMonitor's logged names and steps (its figures, the machine's memory and CPU use, vary by the moment)
DEVICE_STATS = """
class Recorder(Logger):
    name, version = "recorder", 0  # plain attributes stand for the abstract properties

    def __init__(self):
        super().__init__()
        self.calls = []

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        names = sorted(k for k in metrics if k.startswith("DeviceStatsMonitor"))
        if names:
            self.calls.append([names, step, all(isinstance(metrics[k], float) for k in names)])


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(6, 1)

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


recorder = Recorder()
trainer = Trainer(accelerator="cpu", max_epochs=2, log_every_n_steps=2, logger=recorder, enable_progress_bar=False,
                  enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                  callbacks=[DeviceStatsMonitor()])
trainer.fit(Net(), DataLoader(data(20, 0), batch_size=4), DataLoader(data(8, 1), batch_size=4))
print("RESULTS", json.dumps({"calls": recorder.calls}))
"""

PROGRAMS = {"callbacks": CALLBACKS, "lr_find": LR_FIND, "batch_size": BATCH_SIZE, "swa": SWA, "ddp": DDP,
            "device_stats": DEVICE_STATS}


def source(library: str, program: str = "callbacks") -> str:
    """``program`` with ``library``'s ("torchfleet" or "lightning") import lines."""
    return (TORCHFLEET if library == "torchfleet" else LIGHTNING) + COMMON + PROGRAMS[program]
