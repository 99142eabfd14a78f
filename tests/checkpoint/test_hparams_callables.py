"""Hyperparameters that are callables (Hydra's ``_partial_: true`` optimizers, classes, functions, partials of them)
load back from the run's own checkpoints without any flag, and a file naming another callable is refused.

The files are read with plain ``torch.load(weights_only=True)`` (no allowlist) to show that they hold plain values
only; what comes back is compared with what the program gave ``save_hyperparameters``.
"""

from __future__ import annotations

import enum
import functools
import json
import math
import os
import pathlib
import shlex

import pytest
import torch
from torch import nn

from tests.checkpoint import hydra_style_program
from tests.checkpoint.test_safe_roundtrip import Optim
from tests.helpers import RegressionData, Regressor, quiet
from tests.lightning_reference import LIGHTNING_PYTHON, finish, needs_lightning, start_in_lightning
from torchfleet import Trainer
from torchfleet.callbacks import ModelCheckpoint
from torchfleet.checkpoint import hparams as hparams_module
from torchfleet.checkpoint.consolidate import consolidate
from torchfleet.checkpoint.format import read_checkpoint
from torchfleet.checkpoint.hparams import TAG
from torchfleet.errors import CheckpointError


class Mode(enum.Enum):
    FAST = 1
    SLOW = 2


def make_block(d_in: int, hidden: int, act=nn.Tanh, mode: Mode = Mode.FAST, optim: Optim | None = None,
               root: pathlib.Path | None = None) -> nn.Module:
    """A function of the program's own code, given to the model as a partial."""
    return nn.Sequential(nn.Linear(d_in, hidden), act())


class Built(Regressor):
    """A model whose layers come from callables in its hyperparameters."""

    def __init__(self, block=functools.partial(make_block), head=nn.Linear, init=nn.init.zeros_, cfg=None,  # noqa: B008 - a partial default is the point
                 extra=None, pool=math.sqrt, dtype=float, **regressor):
        super().__init__(**regressor)  # Regressor's save_hyperparameters() records these arguments too
        self.net = nn.Sequential(block(8, 16), head(16, 1))
        init(self.net[1].bias)


def _given():
    from omegaconf import OmegaConf

    return dict(
        block=functools.partial(make_block, act=functools.partial(nn.LeakyReLU, negative_slope=0.2), mode=Mode.SLOW,
                                optim=Optim(lr=0.3), root=pathlib.Path("/data/x")),
        head=nn.Linear, init=nn.init.zeros_,
        cfg=OmegaConf.create({"optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1}}),
        extra={"loss": nn.SmoothL1Loss(beta=0.5)}, pool=math.sqrt)


def _assert_same(got, given):
    block = got["block"]
    assert type(block) is functools.partial and block.func is make_block
    assert block.keywords["act"].func is nn.LeakyReLU and block.keywords["act"].keywords == {"negative_slope": 0.2}
    assert block.keywords["mode"] is Mode.SLOW and block.keywords["optim"] == Optim(lr=0.3)
    assert block.keywords["root"] == pathlib.Path("/data/x")
    assert got["head"] is nn.Linear and got["init"] is nn.init.zeros_ and got["pool"] is math.sqrt
    assert got["cfg"] == given["cfg"] and type(got["cfg"]) is type(given["cfg"])
    loss = got["extra"]["loss"]
    assert type(loss) is nn.SmoothL1Loss and loss.beta == 0.5 and loss(torch.zeros(2), torch.ones(2)) == 0.75


def test_callables_partials_and_modules_round_trip_with_no_flag(tmp_path):
    pytest.importorskip("omegaconf", reason="omegaconf is not installed (Hydra users' configs)")
    given = _given()
    ckpt = ModelCheckpoint(dirpath=tmp_path, monitor="train_loss", save_last=True)
    first = Trainer(**quiet(max_epochs=1, enable_checkpointing=True, callbacks=[ckpt]))
    model = Built(**given)
    first.fit(model, datamodule=RegressionData())
    raw = torch.load(tmp_path / "last.ckpt", weights_only=True)  # no allowlist: plain values only
    assert raw["hyper_parameters"]["block"][TAG] == "partial"
    assert raw["hyper_parameters"]["head"] == {TAG: "callable", "name": "torch.nn.modules.linear:Linear"}
    first.test(datamodule=RegressionData(), ckpt_path="best")  # no weights_only=False
    loaded = Built.load_from_checkpoint(ckpt.best_model_path)
    _assert_same(loaded.hparams, given)
    assert isinstance(loaded.net[0][1], nn.LeakyReLU) and loaded.net[0][1].negative_slope == 0.2
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    resumed = Trainer(**quiet(max_epochs=2, enable_checkpointing=True,
                              callbacks=[ModelCheckpoint(dirpath=tmp_path, monitor="train_loss", save_last=True)]))
    resumed.fit(Built(**_given()), datamodule=RegressionData(), ckpt_path="last")
    assert resumed.global_step == 2 * first.global_step
    consolidate(tmp_path / "last.ckpt", tmp_path / "one.ckpt")  # a rewritten file keeps the plain form
    assert torch.load(tmp_path / "one.ckpt", weights_only=True)["hyper_parameters"]["pool"][TAG] == "callable"
    _assert_same(Built.load_from_checkpoint(tmp_path / "one.ckpt").hparams, given)


def test_a_callable_the_program_does_not_hold_needs_allowing(tmp_path, monkeypatch):
    # math.sqrt is the standard library's: trusted only while the program holds it in its own hyperparameters
    trainer = Trainer(**quiet(max_epochs=1))
    trainer.fit(Built(), datamodule=RegressionData())
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    monkeypatch.setattr(hparams_module, "_HELD", set())  # as in a new process that has built no model yet
    with pytest.raises(CheckpointError, match=r"asks to import and call 'math\.sqrt'.*add_safe_globals"):
        Built.load_from_checkpoint(tmp_path / "model.ckpt")
    with torch.serialization.safe_globals([math.sqrt]):
        loaded = Built.load_from_checkpoint(tmp_path / "model.ckpt").hparams
    assert loaded.pool is math.sqrt and loaded.dtype is float  # a builtin value type needs no allowing
    Built()  # the program builds its model again (a resume): it holds math.sqrt
    assert Built.load_from_checkpoint(tmp_path / "model.ckpt").hparams.pool is math.sqrt


@pytest.mark.parametrize("where", ["callable", "partial"])
def test_a_file_naming_os_system_is_refused_everywhere(tmp_path, where):
    trainer = Trainer(**quiet(max_epochs=1))
    trainer.fit(Built(), datamodule=RegressionData())
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    raw = torch.load(tmp_path / "model.ckpt", weights_only=True)
    marker = tmp_path / "ran"
    system = {TAG: "callable", "name": "os:system"}
    raw["hyper_parameters"]["init"] = system if where == "callable" else {
        TAG: "partial", "func": system, "args": [f"touch {shlex.quote(str(marker))}"], "keywords": {}}
    torch.save(raw, tmp_path / "hostile.ckpt")
    message = (r"'.*hostile\.ckpt' was not loaded: it asks to import and call 'os\.system', which could run code "
               r"of the file's choosing\. .*weights_only=False")
    with pytest.raises(CheckpointError, match=message):
        Built.load_from_checkpoint(tmp_path / "hostile.ckpt")
    with pytest.raises(CheckpointError, match=message):
        Trainer(**quiet(max_epochs=2)).fit(Built(), datamodule=RegressionData(), ckpt_path=tmp_path / "hostile.ckpt")
    with pytest.raises(CheckpointError, match=message):
        consolidate(tmp_path / "hostile.ckpt", tmp_path / "out.ckpt")
    assert not marker.exists() and not (tmp_path / "out.ckpt").exists()
    # trusting the file gives the function back (never called by loading)
    got = read_checkpoint(tmp_path / "hostile.ckpt", weights_only=False)["hyper_parameters"]["init"]
    assert getattr(got, "func", got) is os.system and not marker.exists()


@pytest.fixture(scope="module")
def torchfleet_hydra_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hydra")
    lightning = None
    if os.path.exists(LIGHTNING_PYTHON):  # started first, so both interpreters import torch at once
        lightning = start_in_lightning(
            f"import runpy, sys; sys.argv = ['p', 'lightning', {str(folder / 'lightning')!r}]; "
            f"runpy.run_path({hydra_style_program.__file__!r}, run_name='__main__')")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as Lightning's side (OMP_NUM_THREADS=1), for bitwise equal results
    try:
        return hydra_style_program.run("torchfleet", str(folder / "torchfleet")), lightning
    finally:
        torch.set_num_threads(threads)


def test_hydra_template_style_program_tests_best_and_resumes_without_a_flag(torchfleet_hydra_run):
    got, _ = torchfleet_hydra_run
    assert got["best"] == "epoch=2-step=18.ckpt" and got["global_step"] == 4 * 6  # 192 rows in batches of 32
    assert got["optimizer"] == ["Adam", {"lr": 0.01, "weight_decay": 0.0}]
    assert got["scheduler"] == ["ReduceLROnPlateau", {"mode": "min", "factor": 0.1, "patience": 1}]
    assert got["loaded_equal"] and 0 < got["test"]["test/loss"] < 1.1  # ln 3 = 1.0986 is chance
    assert got["resumed"] != got["test"]


@needs_lightning
def test_hydra_template_style_program_matches_lightning(torchfleet_hydra_run):
    got, lightning = torchfleet_hydra_run
    expected = json.loads(finish(lightning).strip().splitlines()[-1])
    assert got == expected
