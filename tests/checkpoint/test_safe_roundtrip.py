"""Everything torchfleet writes loads under safe loading: hyperparameters of every kind people save, RNG states
(NumPy's too), LR schedulers, callbacks' and precisions' states, AsyncCheckpointIO's files.

The checks read the files with plain ``torch.load(weights_only=True)`` (no allowlist at all), then load
them back through torchfleet and compare with what was saved.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import enum
import pathlib
import warnings
from typing import NamedTuple

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers import RegressionData, Regressor, quiet
from torchfleet import Module, Trainer
from torchfleet.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from torchfleet.checkpoint import AsyncCheckpointIO
from torchfleet.checkpoint.consolidate import consolidate
from torchfleet.checkpoint.format import read_checkpoint
from torchfleet.checkpoint.hparams import TAG
from torchfleet.errors import CheckpointError
from torchfleet.loggers import CSVLogger


class Activation(enum.Enum):
    RELU = "relu"
    TANH = "tanh"


class Width(enum.IntEnum):
    NARROW = 8
    WIDE = 16


@dataclasses.dataclass
class Optim:
    lr: float = 0.05
    betas: tuple = (0.9, 0.99)


@dataclasses.dataclass(frozen=True)
class Config:
    width: Width = Width.NARROW
    act: Activation = Activation.TANH
    data_dir: pathlib.Path = pathlib.Path("/data/set")
    optim: Optim = dataclasses.field(default_factory=Optim)
    tags: frozenset = frozenset({"a", "b"})


class Pair(NamedTuple):
    low: int
    high: int


DEFAULT, OUT, PAIR = Config(), pathlib.PurePosixPath("/out"), Pair(0, 1)


class Configured(Module):
    """A model whose ``__init__`` takes every kind of hyperparameter people save."""

    def __init__(self, config: Config = DEFAULT, args: argparse.Namespace | None = None,
                 out: pathlib.PurePosixPath = OUT, act: Activation = Activation.RELU,
                 sizes: tuple = (1, [2, 3]), table: dict | None = None, pair: Pair = PAIR, omega=None,
                 scale: float = 1.0):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, int(config.width)), nn.Tanh(), nn.Linear(int(config.width), 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.config.optim.lr)


def _every_kind():
    kinds = dict(config=Config(width=Width.WIDE, act=Activation.RELU, data_dir=pathlib.Path("runs/x"),
                               optim=Optim(lr=0.1)),
                 args=argparse.Namespace(seed=3, path=pathlib.Path("/a/b"), act=Activation.TANH),
                 out=pathlib.PurePosixPath("/tmp/out"), act=Activation.TANH,
                 sizes=(4, [5, {6}]), pair=Pair(2, 9),
                 table=collections.OrderedDict(a=1, b={"c": 2.5}, by_act={Activation.RELU: {Activation.TANH}}),
                 scale=np.float64(0.5))
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return kinds
    kinds["omega"] = {"dict": OmegaConf.create({"lr": 0.1, "model": {"layers": [1, 2]}, "ref": "${lr}"}),
                      "list": OmegaConf.create([1, {"a": Activation.RELU}])}
    return kinds


def _fit_and_save(tmp_path, **hparams):
    trainer = Trainer(**quiet(max_epochs=1, default_root_dir=tmp_path))
    model = Configured(**hparams)
    trainer.fit(model, datamodule=RegressionData())
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    return model, tmp_path / "model.ckpt"


def test_every_kind_of_hyperparameter_round_trips_through_safe_loading(tmp_path):
    given = _every_kind()
    model, path = _fit_and_save(tmp_path, **given)
    raw = torch.load(path, weights_only=True)  # no allowlist: plain values only
    assert raw["hyper_parameters"]["act"][TAG] == "enum"
    loaded = Configured.load_from_checkpoint(path)  # safe by default
    for name, value in given.items():
        if name == "omega":
            continue
        got = loaded.hparams[name]
        assert got == value and type(got) is type(value) or name == "scale", name
    assert loaded.hparams.scale == 0.5 and type(loaded.hparams.scale) is float  # a NumPy scalar comes back a float
    assert type(loaded.hparams.config.optim) is Optim and loaded.hparams.config.data_dir == pathlib.Path("runs/x")
    assert type(loaded.hparams.args.act) is Activation and loaded.hparams.table["b"] == {"c": 2.5}
    assert loaded.net[0].out_features == 16  # built from the saved config
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    consolidate(path, tmp_path / "consolidated.ckpt")  # rewritten files keep the plain form
    assert torch.load(tmp_path / "consolidated.ckpt", weights_only=True)["hyper_parameters"]["act"][TAG] == "enum"
    assert Configured.load_from_checkpoint(tmp_path / "consolidated.ckpt").hparams.config == given["config"]


def test_omegaconf_configs_round_trip(tmp_path):
    omegaconf = pytest.importorskip("omegaconf", reason="omegaconf is not installed (Hydra users' configs)")
    given = _every_kind()["omega"]
    omegaconf.OmegaConf.set_struct(given["dict"], True)
    _, path = _fit_and_save(tmp_path, omega=given)
    torch.load(path, weights_only=True)
    got = Configured.load_from_checkpoint(path).hparams.omega
    assert isinstance(got["dict"], omegaconf.DictConfig) and isinstance(got["list"], omegaconf.ListConfig)
    assert got["dict"] == given["dict"] and got["dict"].ref == 0.1 and got["dict"].model.layers == [1, 2]
    assert omegaconf.OmegaConf.is_struct(got["dict"])
    assert got["list"][1].a is Activation.RELU


def test_lightning_style_raw_hyperparameters_load_safely(tmp_path):
    # Lightning pickles hyper_parameters as they are: the standard classes among them load without opting in
    omegaconf = pytest.importorskip("omegaconf", reason="omegaconf is not installed (Hydra users' configs)")
    model = Regressor()
    first = Trainer(**quiet(max_epochs=1))
    first.fit(model, datamodule=RegressionData())
    first.save_checkpoint(tmp_path / "model.ckpt")
    raw = torch.load(tmp_path / "model.ckpt", weights_only=True)
    raw["hyper_parameters"] = {"args": argparse.Namespace(lr=0.1, root=pathlib.Path("/x")), "names": frozenset({"a"}),
                               "cfg": omegaconf.OmegaConf.create({"a": {"b": 1}})}
    raw["rng"]["numpy"] = np.random.get_state()  # older checkpoints: NumPy's state with its ndarray
    torch.save(raw, tmp_path / "lightning.ckpt")
    hparams = read_checkpoint(tmp_path / "lightning.ckpt")["hyper_parameters"]
    assert hparams["args"] == argparse.Namespace(lr=0.1, root=pathlib.Path("/x")) and hparams["names"] == {"a"}
    assert isinstance(hparams["cfg"], omegaconf.DictConfig) and hparams["cfg"].a.b == 1
    trainer = Trainer(**quiet(max_epochs=2))
    trainer.fit(Regressor(), datamodule=RegressionData(), ckpt_path=tmp_path / "lightning.ckpt")
    assert trainer.global_step == 2 * first.global_step


def test_a_class_that_is_not_imported_is_named_not_imported(tmp_path):
    _, path = _fit_and_save(tmp_path, act=Activation.TANH)
    raw = torch.load(path, weights_only=True)
    raw["hyper_parameters"]["act"]["class"] = "some_module_never_imported:Activation"
    torch.save(raw, path)
    with pytest.raises(CheckpointError, match=r"hparams\['act'\].*some_module_never_imported\.Activation.*not imported"):
        Configured.load_from_checkpoint(path)
    assert "some_module_never_imported" not in __import__("sys").modules
    assert Configured.load_from_checkpoint(path, act=Activation.RELU).hparams.act is Activation.RELU  # given instead


class Scale:
    """A callable object: neither a value safe loading builds nor a class or function found by its import path."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, x):
        return x * self.factor

    def __eq__(self, other):
        return type(other) is Scale and other.factor == self.factor


def test_a_hyperparameter_that_stays_pickled_is_announced_when_saved(tmp_path):
    with pytest.warns(UserWarning, match=r"hparams\['act'\] \(a tests\.checkpoint\.test_safe_roundtrip\.Scale\).*weights_only=False"):
        _, path = _fit_and_save(tmp_path, act=Scale(2.0))
    with pytest.raises(CheckpointError, match=r"asks to import and call '.*Scale'"):
        Configured.load_from_checkpoint(path)
    assert Configured.load_from_checkpoint(path, weights_only=False).hparams.act == Scale(2.0)


SCHEDULERS = {
    "lambda": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.9 ** e),
    "onecycle": lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=100),
    "cyclic": lambda opt: torch.optim.lr_scheduler.CyclicLR(opt, 0.01, 0.1),
    "sequential": lambda opt: torch.optim.lr_scheduler.SequentialLR(
        opt, [torch.optim.lr_scheduler.LinearLR(opt), torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)], [3]),
    "chained": lambda opt: torch.optim.lr_scheduler.ChainedScheduler(
        [torch.optim.lr_scheduler.LinearLR(opt), torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)]),
    "plateau": lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
    "warm_restarts": lambda opt: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, 2),
}


class Scheduled(Regressor):
    def __init__(self, kind: str = "lambda"):
        super().__init__()
        self.kind = kind

    def training_step(self, batch, batch_idx):
        np.random.rand()  # NumPy's generator is part of the run's RNG state
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=0.05)
        sched = SCHEDULERS[self.kind](opt)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "monitor": "train_loss"}}


@pytest.mark.parametrize(("kind", "precision", "io"), [
    ("lambda", "32-true", None), ("onecycle", "bf16-mixed", None), ("cyclic", "16-mixed", None),
    ("sequential", "32-true", "async"), ("chained", "32-true", None), ("plateau", "64-true", None),
    ("warm_restarts", "32-true", "async"),
])
def test_checkpoints_of_every_part_load_safely_and_resume(tmp_path, kind, precision, io):
    def trainer(max_epochs):
        return Trainer(**quiet(
            max_epochs=max_epochs, default_root_dir=tmp_path, precision=precision, enable_checkpointing=True,
            logger=CSVLogger(tmp_path, name="logs"),  # LearningRateMonitor needs one, as in Lightning
            plugins=[AsyncCheckpointIO()] if io else None,
            callbacks=[ModelCheckpoint(dirpath=pathlib.Path(tmp_path) / "ck", monitor="val_loss", save_last=True,
                                       save_top_k=2), EarlyStopping(monitor="val_loss", patience=5),
                       LearningRateMonitor()]))

    np.random.seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # schedulers' and AMP-on-CPU notices
        first = trainer(2)
        first.fit(Scheduled(kind), datamodule=RegressionData())
    files = sorted((tmp_path / "ck").glob("*.ckpt"))
    assert len(files) >= 2
    for file in files:
        saved = torch.load(file, weights_only=True)  # not even the standard classes are needed
        assert saved["lr_schedulers"] and saved["callbacks"] and isinstance(saved["rng"]["numpy"], tuple)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = trainer(3)
        resumed.fit(Scheduled(kind), datamodule=RegressionData(), ckpt_path="last")
    assert resumed.ckpt_path == str(tmp_path / "ck" / "last.ckpt")
    assert resumed.global_step == 3 * first.global_step // 2
