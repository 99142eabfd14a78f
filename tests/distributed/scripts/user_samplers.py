"""Samplers and batch samplers of the user's own, and loggers, on 2 ranks: what each rank read, what was logged.

Usage: python user_samplers.py '{"mode": MODE, "dir": OUT_DIR}', MODE "trainer" or "fleet" (ddp: the script is run
again for rank 1) or "fleet_spawn" (loggers only, under ddp_spawn).
Every sample is ``(x, y, index)``; each rank records the indices of every batch it read. Rank 0 gathers what
every rank recorded and writes it with the metrics to ``OUT_DIR/results.pt``; the tests compare it with what one
process reads (``one_process_epoch``). The loggers write under ``OUT_DIR/logs``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import (
    DataLoader,
    IterableDataset,
    Sampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)

import torchfleet as tf
from torchfleet.errors import ConfigurationError

N = 64
#: k-fold: 4 folds of 16 validation and 48 training samples (24 per rank: training with the whole fold per step)
FOLDS = 4
#: an odd number of validation samples: 8 on rank 0, 7 on rank 1, none twice
UNEVEN_VAL = [3, 5, 8, 13, 21, 34, 55, 1, 2, 9, 10, 40, 41, 60, 63]
#: the training subset: every index not divisible by 3 (42 samples, 21 per rank)
SUBSET = [i for i in range(N) if i % 3]
#: weights: indices 0..15 can never be drawn; drawn without replacement, an epoch is the other 48 in random order
WEIGHTS = [0.0] * 16 + [1.0 + (i % 5) for i in range(16, N)]
EPOCHS = 3
#: the batch sampler's indices: 12 batches of 5, 6 per rank
BUCKETED = 60


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(N, 4, generator=g)
    return TensorDataset(x, torch.sin(x).sum(1, keepdim=True), torch.arange(N))


class Buckets(Sampler[list[int]]):
    """A batch sampler of the user's own: a random permutation of ``range(n)`` cut into batches of ``size``."""

    def __init__(self, n: int = BUCKETED, size: int = 5) -> None:
        self.n, self.size = n, size

    def __iter__(self):
        order = torch.randperm(self.n).tolist()
        return iter([order[i:i + self.size] for i in range(0, self.n, self.size)])

    def __len__(self) -> int:
        return -(-self.n // self.size)


class Stream(IterableDataset):
    """An IterableDataset that does not shard itself."""

    def __iter__(self):
        data = make_data()
        return iter(data[i] for i in range(16))


def kfold_split(fold: int) -> tuple[list[int], list[int]]:
    val = list(range(fold * N // FOLDS, (fold + 1) * N // FOLDS))
    return [i for i in range(N) if i not in val], val


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def gather(obj):
    """Every rank's ``obj`` (a list, rank order); one process: ``[obj]``."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


# ------------------------------------------------------------------------------------------- Trainer
class Recorder(tf.Module):
    """Records (epoch, batch_idx, indices) of each training batch and the indices of each validation batch;
    logs val_loss (sync_dist) and gathers the validation set's summed loss and sample count over the ranks."""

    def __init__(self, lr: float = 0.05, log_to_loggers: bool = False) -> None:
        super().__init__()
        self.net = net()
        self.lr = lr
        self.log_to_loggers = log_to_loggers
        self.seen: list[tuple[int, int, list[int]]] = []
        self.val_seen: list[int] = []
        self._val_parts: list[torch.Tensor] = []
        self.val_total: list[float] = []  # per validation run: [summed loss over every rank, samples]

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        self.seen.append((self.current_epoch, batch_idx, idx.tolist()))
        loss = nn.functional.mse_loss(self.net(x), y)
        if self.log_to_loggers:  # what Lightning programs do from every rank; only rank 0's may reach a file
            self.logger.experiment.add_scalar("rank_of_writer", float(self.global_rank), self.global_step)
            for lg in self.loggers:
                lg.log_metrics({"rank_of_writer": float(self.global_rank)}, step=self.global_step)
            self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y, idx = batch
        self.val_seen.extend(idx.tolist())
        per_sample = ((self.net(x) - y) ** 2).mean(1)
        self._val_parts.append(torch.stack([per_sample.sum(), torch.tensor(float(len(x)))]))
        self.log("val_loss", per_sample.mean(), sync_dist=True, batch_size=len(x))

    def on_validation_epoch_end(self):
        mine = torch.stack(self._val_parts).sum(0) if self._val_parts else torch.zeros(2)
        self._val_parts.clear()
        self.val_total.append(self.all_gather(mine).reshape(-1, 2).sum(0).tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class SaveAt(tf.callbacks.Callback):
    """Writes a checkpoint after global step ``step`` (mid-epoch); the run goes on."""

    def __init__(self, path: str, step: int) -> None:
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def make_trainer(strategy: str, devices: int, **kw) -> tf.Trainer:
    settings = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                "enable_model_summary": False, "num_sanity_val_steps": 0, "max_epochs": EPOCHS, **kw}
    return tf.Trainer(strategy=strategy, accelerator="cpu", devices=devices, **settings)


def trainer_fit(strategy: str, devices: int, train: DataLoader, val: DataLoader | None = None, **kw) -> Recorder:
    model = Recorder()
    make_trainer(strategy, devices, **kw).fit(model, train, val)
    return model


def kfold(strategy: str, devices: int) -> list[dict]:
    """Lightning's k-fold recipe with samplers: per fold, train on the fold's subset and validate on the rest."""
    data, out = make_data(), []
    for fold in range(FOLDS):
        train_ids, val_ids = kfold_split(fold)
        # the whole training fold per optimizer step (split among the ranks): any order gives the same steps
        train = DataLoader(data, batch_size=len(train_ids) // devices, sampler=SubsetRandomSampler(train_ids))
        val = DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(val_ids))
        model = Recorder(lr=0.2)
        trainer = make_trainer(strategy, devices)
        trainer.fit(model, train, val)
        out.append({"val_loss": float(trainer.callback_metrics["val_loss"]), "val_total": model.val_total[-1],
                    "val_seen": gather(model.val_seen),
                    "weights": {k: v.detach().clone() for k, v in model.state_dict().items()}})
    return out


def run_trainer(out_dir: str, strategy: str = "ddp", devices: int = 2) -> dict:
    data = make_data()
    res: dict = {}
    model = trainer_fit(strategy, devices, DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(SUBSET)),
                        DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(UNEVEN_VAL)))
    res["subset"] = {"train": gather(model.seen), "val": gather(model.val_seen), "val_total": model.val_total}
    model = trainer_fit(strategy, devices, DataLoader(data, batch_size=4, sampler=WeightedRandomSampler(
        WEIGHTS, num_samples=N - 16, replacement=False)))
    res["weighted"] = gather(model.seen)
    model = trainer_fit(strategy, devices, DataLoader(data, batch_sampler=Buckets()))
    res["buckets"] = gather(model.seen)
    model = trainer_fit(strategy, devices, DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(SUBSET)),
                        max_epochs=1, use_distributed_sampler=False)
    res["kept"] = gather(model.seen)

    # validate alone, with an uneven subset: the 1-process loss, each sample once
    model = Recorder()
    metrics = make_trainer(strategy, devices).validate(
        model, DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(UNEVEN_VAL)))
    res["validate"] = {"val_loss": metrics[0]["val_loss"], "val_total": model.val_total[-1],
                       "val_seen": gather(model.val_seen)}
    res["kfold"] = kfold(strategy, devices)

    # fsdp: the same dealing out; evaluation is evened out (each forward needs every rank), one sample twice
    model = trainer_fit("fsdp", devices, DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(SUBSET)),
                        DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(UNEVEN_VAL)), max_epochs=1)
    res["fsdp"] = {"train": gather(model.seen), "val": gather(model.val_seen)}

    # resume mid-epoch (epoch 1, after its 2nd step) with a wrapped random sampler: the same batches follow
    ckpt = os.path.join(out_dir, "mid.ckpt")
    loader = DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(SUBSET))
    whole = Recorder()
    make_trainer(strategy, devices, callbacks=[SaveAt(ckpt, 8)]).fit(whole, loader)
    resumed = Recorder()
    with torch.no_grad():
        for p in resumed.parameters():
            p.add_(1.0)  # other weights: everything must come from the checkpoint
    make_trainer(strategy, devices).fit(resumed, loader, ckpt_path=ckpt)
    res["resume"] = {"whole": gather(whole.seen), "resumed": gather(resumed.seen),
                     "same_weights": all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(),
                                                                            resumed.state_dict().values()))}

    # an IterableDataset cannot be split: one warning, from rank 0, for the training and the validation loader
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer_fit(strategy, devices, DataLoader(Stream(), batch_size=4), DataLoader(Stream(), batch_size=4),
                    max_epochs=2)
    res["iterable_warnings"] = gather(sum("IterableDataset" in str(w.message) for w in caught))

    # loggers: every rank calls them; one version folder, written by rank 0 only
    logs = os.path.join(out_dir, "logs")
    loggers = [tf.loggers.TensorBoardLogger(logs, name="tb"), tf.loggers.CSVLogger(logs, name="csv", flush_logs_every_n_steps=1)]
    trainer = make_trainer(strategy, devices, logger=loggers, log_every_n_steps=1, max_epochs=1)
    trainer.fit(Recorder(log_to_loggers=True), DataLoader(data, batch_size=8))
    res["log_dirs"] = gather([lg.log_dir for lg in loggers])
    return res


# --------------------------------------------------------------------------------------------- Fleet
def fleet_epochs(fleet: tf.Fleet, loader, epochs: int = EPOCHS, model=None, opt=None) -> list:
    """Train (when given a model) and record (epoch, batch_idx, indices) for every batch of every epoch."""
    seen = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for i, (x, y, idx) in enumerate(loader):
            seen.append((epoch, i, idx.tolist()))
            if model is not None:
                opt.zero_grad()
                fleet.backward(nn.functional.mse_loss(model(x), y))
                opt.step()
    return seen


def fleet_kfold(fleet: tf.Fleet) -> list[dict]:
    data, out = make_data(), []
    for fold in range(FOLDS):
        train_ids, val_ids = kfold_split(fold)
        model = net()
        opt = torch.optim.SGD(model.parameters(), lr=0.2)
        model, opt = fleet.setup(model, opt)
        train, val = fleet.setup_dataloaders(
            DataLoader(data, batch_size=len(train_ids) // fleet.world_size, sampler=SubsetRandomSampler(train_ids)),
            DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(val_ids)))
        fleet_epochs(fleet, train, model=model, opt=opt)
        total, seen = torch.zeros(2), []
        with torch.no_grad():
            for x, y, idx in val:
                per_sample = ((model(x) - y) ** 2).mean(1)
                total += torch.stack([per_sample.sum(), torch.tensor(float(len(x)))])
                seen.extend(idx.tolist())
        summed = fleet.all_gather(total).reshape(-1, 2).sum(0)
        out.append({"val_loss": float(summed[0] / summed[1]), "val_total": summed.tolist(), "val_seen": gather(seen),
                    "weights": {k: v.detach().clone() for k, v in model.module.state_dict().items()}})
    return out


def run_fleet(fleet: tf.Fleet, out_dir: str) -> dict:
    data = make_data()
    res: dict = {}
    loader = fleet.setup_dataloaders(DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(SUBSET)))
    res["subset"] = {"train": gather(fleet_epochs(fleet, loader))}
    loader = fleet.setup_dataloaders(DataLoader(data, batch_size=4, sampler=WeightedRandomSampler(
        WEIGHTS, num_samples=N - 16, replacement=False)))
    res["weighted"] = gather(fleet_epochs(fleet, loader))
    res["buckets"] = gather(fleet_epochs(fleet, fleet.setup_dataloaders(DataLoader(data, batch_sampler=Buckets()))))
    loader = fleet.setup_dataloaders(DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(SUBSET)),
                                     use_distributed_sampler=False)
    res["kept"] = gather(fleet_epochs(fleet, loader, epochs=1))
    res["kfold"] = fleet_kfold(fleet)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fleet.setup_dataloaders(DataLoader(Stream(), batch_size=4), DataLoader(Stream(), batch_size=4))
    res["iterable_warnings"] = gather(sum("IterableDataset" in str(w.message) for w in caught))

    res["unequal_draws"] = unequal_draws(fleet)
    res["log_dirs"] = log_from_every_rank(fleet)
    return res


def unequal_draws(fleet: tf.Fleet) -> dict:
    """The ranks' generators differ when the sampler draws: what each rank's first pass raises, then whether a pass
    after seeding alike again runs (the error left the ranks in step)."""
    loader = fleet.setup_dataloaders(DataLoader(make_data(), batch_size=4, sampler=SubsetRandomSampler(SUBSET)))
    torch.manual_seed(10 + fleet.global_rank)
    try:
        next(iter(loader))
        message = None
    except ConfigurationError as exc:
        message = str(exc)
    torch.manual_seed(10)
    return {"messages": gather(message), "batches_after": gather(len(list(loader)))}


def log_from_every_rank(fleet: tf.Fleet) -> list:
    """Call the loggers from every rank, as custom loops do; every rank's loggers' folders (rank order)."""
    for step in range(3):
        fleet.log_dict({"rank_of_writer": float(fleet.global_rank)}, step=step)
        for lg in fleet.loggers:
            lg.log_metrics({"rank_of_writer": float(fleet.global_rank)}, step=step)
            lg.log_hyperparams({"rank": fleet.global_rank})
        fleet.logger.experiment.add_scalar("rank_of_writer", float(fleet.global_rank), step)
    for lg in fleet.loggers:
        lg.save()
    return gather([lg.log_dir for lg in fleet.loggers[:2]])


def fleet_loggers(out_dir: str, optional: bool = False) -> list:
    """TensorBoard and CSV; with ``optional``, MLflow (a local store) and W&B (offline) where installed."""
    logs = os.path.join(out_dir, "logs")
    loggers = [tf.loggers.TensorBoardLogger(logs, name="tb"), tf.loggers.CSVLogger(logs, name="csv")]
    if optional and importlib.util.find_spec("mlflow") is not None:
        loggers.append(tf.loggers.MLflowLogger(experiment_name="samplers", save_dir=os.path.join(logs, "mlflow")))
    if optional and importlib.util.find_spec("wandb") is not None:
        os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLE_GIT="true")
        loggers.append(tf.loggers.WandbLogger(project="samplers", save_dir=os.path.join(logs, "wandb"), offline=True))
    return loggers


def main(mode: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    tf.seed_everything(0)
    results = os.path.join(out_dir, "results.pt")
    if mode == "trainer":
        res = run_trainer(out_dir)
        if dist.get_rank() == 0:
            torch.save(res, results)
    elif mode == "fleet":
        fleet = tf.Fleet(strategy="ddp", accelerator="cpu", devices=2, loggers=fleet_loggers(out_dir))
        fleet.launch()
        res = run_fleet(fleet, out_dir)
        if fleet.global_rank == 0:
            torch.save(res, results)
    else:  # "fleet_spawn": the ranks run in new processes; this one waits, then names rank 0's folders and runs
        loggers = fleet_loggers(out_dir, optional=True)
        ranks_saw = tf.Fleet(strategy="ddp_spawn", accelerator="cpu", devices=2, loggers=loggers).launch(
            spawned_logging)
        torch.save({**ranks_saw, "launcher_log_dirs": [lg.log_dir for lg in loggers[:2]],
                    "launcher_versions": [str(lg.version) for lg in loggers]}, results)


def spawned_logging(fleet: tf.Fleet) -> dict:
    """In each spawned rank: log from every rank; rank 0's folders, loggers and every rank's versions."""
    out = {"log_dirs": log_from_every_rank(fleet), "loggers": [type(lg).__name__ for lg in fleet.loggers],
           "versions": gather([str(lg.version) for lg in fleet.loggers])}
    if fleet.global_rank == 0 and "wandb" in sys.modules:
        sys.modules["wandb"].finish()  # the run's file complete before the test reads it
    return out


if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    main(cfg["mode"], cfg["dir"])
