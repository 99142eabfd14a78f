"""The Module <-> loop door (torchfleet/running.py): what the loop tells a Module, what a Module asks the Trainer or
Fleet running it, and that the Trainer and Fleet answer all of it."""

from __future__ import annotations

import inspect
import pickle
from typing import Protocol

import pytest
import torch
from torch import nn

from tests.helpers import Regressor, loader, quiet
from torchfleet import Fleet, Module, Trainer
from torchfleet.data import DataModule
from torchfleet.errors import ConfigurationError
from torchfleet.running import FleetRunner, LoopDoor, ModuleRunner
from torchfleet.trainer.loop_trainer import LoopTrainer


def _members(protocol: type) -> set[str]:
    """The names a Protocol declares, its own and its bases': attributes, properties and methods."""
    names: set[str] = set()
    for cls in (c for c in protocol.__mro__ if c.__module__.startswith("torchfleet")):
        names |= set(vars(cls).get("__annotations__", {}))
        names |= {name for name, value in vars(cls).items()
                  if not name.startswith("__") and (callable(value) or isinstance(value, property))}
    return names


class Recorder:
    """A ResultsSink that keeps the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log(self, *args) -> None:
        self.calls.append(args)


def test_the_trainer_and_the_fleet_answer_everything_the_module_asks():
    trainer = Trainer(**quiet())
    runner = _members(ModuleRunner)
    assert {"manual_optimizers", "manual_backward", "gradient_clip_arguments", "strategy", "global_step"} <= runner
    assert not [name for name in runner if not hasattr(trainer, name)]
    fleet = Fleet(accelerator="cpu", devices=1)
    assert {"log", "log_dict", "clip_gradients", "strategy"} <= _members(FleetRunner)
    assert not [name for name in _members(FleetRunner) if not hasattr(fleet, name)]
    for protocol, owner in ((ModuleRunner, Trainer), (FleetRunner, Fleet)):
        for name, value in vars(protocol).items():
            if inspect.isfunction(value) and not name.startswith("_"):  # the same parameters, by name
                declared = list(inspect.signature(value).parameters)
                assert list(inspect.signature(getattr(owner, name)).parameters)[: len(declared)] == declared, name
    assert issubclass(ModuleRunner, Protocol) and issubclass(FleetRunner, Protocol)


def test_the_trainer_has_everything_its_loops_name():
    trainer = Trainer(**quiet())
    declared = _members(LoopTrainer)
    assert {"state", "strategy", "_hooks", "_current_fx", "save_checkpoint", "fit_loop", "global_rank",
            "manual_optimizers"} <= declared
    assert not [name for name in declared if not hasattr(trainer, name)]


def test_self_log_records_into_the_door_with_the_running_hook():
    model = Regressor()
    door = model.loop_door
    assert door.results is None and door.current_fx == "" and not door.configured
    model.log("ignored", 1.0)  # outside a Trainer and a Fleet: nothing records it, nothing raises
    sink = Recorder()
    door.results, door.current_fx = sink, "validation_step"
    model.log("val_loss", 0.5, prog_bar=True, batch_size=4)
    assert sink.calls == [("validation_step", "val_loss", 0.5, True, True, None, None, "mean", False, 4)]
    door.results = None
    model.trainer = Trainer(**quiet())
    with pytest.raises(ConfigurationError, match="called from validation_step"):
        model.log("val_loss", 0.5)


def test_a_new_door_records_apart_from_the_original():
    model = Regressor()
    original = Recorder()
    model.loop_door.results, model.loop_door.current_fx = original, "training_step"
    replica = model._replicate_for_data_parallel()  # as dp builds its replicas: the attribute dict copied
    own = Recorder()
    replica.loop_door = replica.loop_door.with_results(own)
    replica.log("loss", 1.0)
    assert own.calls[0][:3] == ("training_step", "loss", 1.0)
    assert original.calls == [] and model.loop_door.results is original


def test_the_door_survives_pickling_as_a_spawned_rank_gets_the_module():
    door = LoopDoor(None, "configure_model", configured=True)
    back = pickle.loads(pickle.dumps(door))
    assert (back.results, back.current_fx, back.configured) == (None, "configure_model", True)
    model = pickle.loads(pickle.dumps(Regressor()))
    assert isinstance(model.loop_door, LoopDoor) and model.loop_door is not door


def test_manual_backward_and_optimizers_go_through_the_runner():
    seen = []

    class Runner:
        optimizers = [torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)]

        def manual_optimizers(self):
            return ["wrapped"]

        def manual_backward(self, loss, *args, **kwargs):
            seen.append((loss, args, kwargs))

    model = Regressor()
    model.automatic_optimization = False
    model.trainer = Runner()
    loss = torch.tensor(2.0)
    model.manual_backward(loss, retain_graph=True)
    assert seen == [(loss, (), {"retain_graph": True})]
    assert model.optimizers() == "wrapped" and model.optimizers(use_pl_optimizer=False) is Runner.optimizers[0]


def test_clip_gradients_asks_the_trainer_for_its_settings():
    trainer = Trainer(gradient_clip_val=0.5, **quiet())
    assert trainer.gradient_clip_arguments(None, None) == (0.5, "norm")
    assert trainer.gradient_clip_arguments(None, "value") == (0.5, "value")
    with pytest.raises(ConfigurationError, match="gradient_clip_val"):
        trainer.gradient_clip_arguments(0.1, None)
    assert Trainer(**quiet()).gradient_clip_arguments(2.0, None) == (2.0, "norm")


def test_configure_model_runs_once_and_the_door_remembers_it():
    class Late(Regressor):
        built = 0

        def configure_model(self):
            type(self).built += 1

    model = Late()
    trainer = Trainer(max_steps=1, **quiet())
    trainer.fit(model, loader())
    assert Late.built == 1 and model.loop_door.configured
    trainer.validate(model, loader())
    assert Late.built == 1
    assert model.loop_door.results is None and model.loop_door.current_fx == ""  # the stage closed the door


def test_fleet_setup_makes_itself_the_modules_fabric():
    fleet = Fleet(accelerator="cpu", devices=1)
    model = Regressor()
    assert model.fabric is None
    fleet.setup(model)
    assert model.fabric is fleet and model.global_rank == 0


def test_logs_hparams_says_what_the_trainer_sends_to_loggers():
    class Data(DataModule):
        def __init__(self, size=3, log=True):
            super().__init__()
            self.save_hyperparameters(logger=log)

    assert not DataModule().logs_hparams
    assert Data().logs_hparams and not Data(log=False).logs_hparams
    assert Regressor().logs_hparams  # tests.helpers.Regressor saves its hyperparameters

    class Plain(Module):
        pass

    assert not Plain().logs_hparams
