"""``torchfleet.utilities.parsing`` and ``.enums`` (Lightning's module paths): attribute lookup across model, hparams
and datamodule during a run, picklability, ``__init__`` arguments from frames, GradClipAlgorithmType; and the Module
behaviours Lightning's tests of those names exercise: ``save_hyperparameters`` of an argparse Namespace or an
OmegaConf config, ``clip_gradients`` with the Trainer's settings or through a Fleet, ``self.log`` in a Fleet loop."""

from __future__ import annotations

import inspect
import threading
from argparse import Namespace

import pytest
import torch

from tests.helpers import RegressionData, Regressor, loader, quiet
from torchfleet import Callback, Module, Trainer
from torchfleet.errors import ConfigurationError
from torchfleet.utilities import AttributeDict, GradClipAlgorithmType, is_picklable
from torchfleet.utilities.parsing import (
    clean_namespace,
    collect_init_args,
    get_init_args,
    lightning_getattr,
    lightning_hasattr,
    lightning_setattr,
    parse_class_init_keys,
)


class BatchSizeModel(Regressor):
    def __init__(self, batch_size: int = 4, **kw):
        super().__init__(**kw)
        self.save_hyperparameters()


def test_lightning_attributes_follow_the_datamodule_of_a_running_trainer():
    seen = {}

    class Tune(Callback):
        def on_fit_start(self, trainer, pl_module):
            # the datamodule's value wins over the model's hparams, as in Lightning's batch-size finder
            seen["before"] = lightning_getattr(pl_module, "batch_size")
            lightning_setattr(pl_module, "batch_size", 2)
            seen["has_lr"] = lightning_hasattr(pl_module, "lr")
            seen["absent"] = lightning_hasattr(pl_module, "no_such_thing")

    model, data = BatchSizeModel(batch_size=4), RegressionData(n=16, batch_size=8)
    Trainer(**quiet(max_epochs=1, callbacks=[Tune()])).fit(model, datamodule=data)
    assert seen == {"before": 8, "has_lr": True, "absent": False}
    # set everywhere it could be read: the model's hparams and the datamodule
    assert model.hparams.batch_size == 2 and data.batch_size == 2
    with pytest.raises(AttributeError, match="'no_such_thing' is neither stored in the model"):
        lightning_getattr(model, "no_such_thing")
    with pytest.raises(AttributeError, match="neither stored"):
        lightning_setattr(model, "no_such_thing", 1)


def test_without_a_trainer_the_model_and_its_hparams_are_read():
    model = BatchSizeModel(batch_size=4)
    model.lr_attribute = 0.5
    assert lightning_getattr(model, "batch_size") == 4
    assert lightning_getattr(model, "lr_attribute") == 0.5
    hparams = model.hparams
    lightning_setattr(model, "batch_size", 16)
    assert model.hparams is hparams and hparams["batch_size"] == 16  # the item written, the dict kept


def test_picklability_and_clean_namespace():
    class Local:
        pass

    assert is_picklable((1, "a", max)) and is_picklable(None)
    assert not is_picklable(Local) and not is_picklable(threading.Lock()) and not is_picklable(lambda: 0)
    given = {"keep": 1, "lock": threading.Lock(), "cls": Local}
    clean_namespace(given)
    assert given == {"keep": 1}
    ns = Namespace(keep=2, fn=lambda: 0)
    clean_namespace(ns)
    assert vars(ns) == {"keep": 2}


def test_init_arguments_read_from_frames():
    class Parent:
        def __init__(self, a, k=1, **extra):
            self.own = get_init_args(inspect.currentframe())
            self.chain = collect_init_args(inspect.currentframe(), [])

    class Child(Parent):
        def __init__(self, a, b, *rest, k=2, **extra):
            super().__init__(a, k=k, **extra)

    child = Child("x", "y", 9, k=3, z=4)
    assert child.own == (child, {"a": "x", "k": 3, "z": 4})
    assert child.chain == [{"a": "x", "k": 3, "z": 4}, {"a": "x", "b": "y", "k": 3, "z": 4}]
    assert get_init_args(inspect.currentframe()) == (None, {})  # not a constructor
    assert parse_class_init_keys(Child) == ("self", "rest", "extra")
    assert parse_class_init_keys(Regressor) == ("self", None, None)


def test_grad_clip_algorithm_type_is_accepted_where_its_string_is():
    assert GradClipAlgorithmType("VALUE") is GradClipAlgorithmType.VALUE == "value"
    assert GradClipAlgorithmType.from_str("Norm") is GradClipAlgorithmType.NORM
    weights = []
    for algorithm in ("value", GradClipAlgorithmType.VALUE, "norm"):
        torch.manual_seed(0)
        model = Regressor()
        Trainer(**quiet(max_steps=3, gradient_clip_val=1e-4, gradient_clip_algorithm=algorithm)).fit(model, loader(n=24))
        weights.append(model.net[0].weight.detach().clone())
    assert torch.equal(weights[0], weights[1])
    assert not torch.equal(weights[0], weights[2])


def test_save_hyperparameters_of_an_argparse_namespace(tmp_path):
    class FromArgs(Regressor):
        def __init__(self, args: Namespace):
            Module.__init__(self)  # not Regressor's, which saves its own arguments
            self.save_hyperparameters(args)
            self.net = torch.nn.Linear(8, 1)

    model = FromArgs(Namespace(lr=0.01, layers=2, scheduler=None))
    assert model.hparams == AttributeDict(lr=0.01, layers=2, scheduler=None) and model.hparams.layers == 2
    trainer = Trainer(**quiet(max_steps=1, default_root_dir=tmp_path))
    trainer.fit(model, loader(n=8))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    saved = torch.load(tmp_path / "m.ckpt", weights_only=True)["hyper_parameters"]
    assert type(saved) is dict and saved == {"lr": 0.01, "layers": 2, "scheduler": None}



def test_clip_gradients_in_a_hook_uses_the_trainers_settings_and_refuses_others():
    class ClipsItself(Regressor):
        clip_with: float | None = None

        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            self.clip_gradients(optimizer, gradient_clip_val=self.clip_with)  # None: the Trainer's, as Lightning

    weights = []
    for model in (ClipsItself(), Regressor()):
        torch.manual_seed(0)
        model.net.load_state_dict(Regressor().net.state_dict())
        Trainer(**quiet(max_steps=3, gradient_clip_val=1e-4, gradient_clip_algorithm="value")).fit(model, loader(n=24))
        weights.append(model.net[0].weight.detach().clone())
    assert torch.equal(weights[0], weights[1])  # clipped by the Trainer's value, as the Trainer itself clips
    model = ClipsItself()
    model.clip_with = 1e-2
    with pytest.raises(ConfigurationError, match=r"Trainer\(gradient_clip_val=0.0001\)` and have passed "
                                                 r"`clip_gradients\(gradient_clip_val=0.01\)"):
        Trainer(**quiet(max_steps=1, gradient_clip_val=1e-4)).fit(model, loader(n=8))


def test_clip_gradients_of_a_fleet_module_goes_through_the_fleet():
    from torchfleet import Fleet

    fleet = Fleet(accelerator="cpu", devices=1)
    calls = []
    real = fleet.clip_gradients
    fleet.clip_gradients = lambda *a, **kw: calls.append(kw) or real(*a, **kw)
    model = Regressor()
    module, optimizer = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = next(iter(loader(n=8)))
    fleet.backward(torch.nn.functional.mse_loss(module(x), y) * 1e4)
    model.clip_gradients(optimizer, 1e-3, GradClipAlgorithmType.VALUE)
    assert calls == [{"clip_val": 1e-3, "max_norm": None}]
    assert max(p.grad.abs().max().item() for p in model.parameters()) == pytest.approx(1e-3)  # clamped there


def test_save_hyperparameters_of_an_omegaconf_config_keeps_the_config(tmp_path):
    omegaconf = pytest.importorskip("omegaconf", reason="Hydra programs pass OmegaConf configs")

    class FromConfig(Regressor):
        def __init__(self, cfg):
            Module.__init__(self)
            self.save_hyperparameters(cfg)
            self.net = torch.nn.Linear(8, 1)

    cfg = omegaconf.OmegaConf.create({"lr": 0.01, "scheduler": None, "optim": {"momentum": 0.5}})
    model = FromConfig(cfg)
    assert isinstance(model.hparams, omegaconf.DictConfig) and model.hparams.optim.momentum == 0.5
    assert model.hparams_initial == cfg and model.hparams_initial is not cfg
    trainer = Trainer(**quiet(max_steps=1, default_root_dir=tmp_path))
    trainer.fit(model, loader(n=8))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    loaded = torch.load(tmp_path / "m.ckpt", weights_only=True)  # a safe load reads it back
    assert loaded["hyper_parameters"]["lr"] == 0.01


def test_a_fleet_modules_log_reaches_the_fleets_loggers_and_refuses_what_cannot_be_logged(tmp_path):
    from torchfleet import Fleet
    from torchfleet.loggers import Logger

    class Recorder(Logger):
        name, version = "rec", 0

        def __init__(self):
            self.calls = []

        def log_metrics(self, metrics, step=None):  # Lightning calls loggers by keyword: metrics=...
            self.calls.append(dict(metrics))

    recorder = Recorder()
    fleet = Fleet(accelerator="cpu", devices=1, loggers=[recorder])
    model = Regressor()
    fleet.setup(model)
    model.log_dict({"a": 1, "b": torch.tensor(0.5)})  # one call with both, as Lightning's Fabric
    model.log("c", 2.0, logger=False)
    assert recorder.calls == [{"a": 1.0, "b": 0.5}]
    with pytest.raises(ConfigurationError, match="`list` values cannot be logged"):
        model.log("bad", [1, 2])
    with pytest.raises(ConfigurationError, match="nested dictionaries cannot be logged"):
        fleet.log_dict({"group": {"x": 1}})
    assert len(recorder.calls) == 1
