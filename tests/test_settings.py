"""TrainingSettings: validated on creation; the Trainer and Fleet hand them to the strategy before setup."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf
from torchfleet.errors import ConfigurationError
from torchfleet.settings import TrainingSettings, loader_batch_size
from torchfleet.strategies.single_device import SingleDeviceStrategy
from torchfleet.trainer.replica_logging import REPLICA_LOGGING


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"accumulate_grad_batches": 0}, r"accumulate_grad_batches=0 is not valid: it must be an int >= 1"),
    ({"accumulate_grad_batches": True}, r"accumulate_grad_batches=True"),
    ({"gradient_clip_val": -1.0}, r"gradient_clip_val=-1.0 is not valid: give a number >= 0 or None"),
    ({"gradient_clip_val": "1"}, r"gradient_clip_val='1'"),
    ({"gradient_clip_algorithm": "max"}, r"gradient_clip_algorithm='max' is not supported.*'norm' and 'value'"),
    ({"gradient_clip_algorithm": None}, r"gradient_clip_algorithm=None"),
    ({"micro_batch_size": 0}, r"micro_batch_size=0 is not valid.*int >= 1, or None"),
])
def test_bad_settings_are_configuration_errors(kwargs, words):
    with pytest.raises(ConfigurationError, match=words):
        TrainingSettings(**kwargs)


def test_defaults_and_immutability():
    settings = TrainingSettings()
    assert (settings.accumulate_grad_batches, settings.gradient_clip_val, settings.gradient_clip_algorithm,
            settings.micro_batch_size) == (1, None, "norm", None)
    with pytest.raises(AttributeError):
        settings.accumulate_grad_batches = 2  # type: ignore[misc]
    assert tf.TrainingSettings is TrainingSettings


def test_loader_batch_size():
    data = TensorDataset(torch.zeros(8, 2))
    assert loader_batch_size(DataLoader(data, batch_size=4)) == 4
    assert loader_batch_size(DataLoader(data, batch_size=None)) is None
    assert loader_batch_size([torch.zeros(2)]) is None


class Recording(SingleDeviceStrategy):
    """A CPU strategy that remembers what configure_training was told before each setup."""

    def __init__(self) -> None:
        super().__init__(device="cpu")
        self.told: list[tuple[TrainingSettings, object]] = []

    def configure_training(self, settings, replica_hooks=None):
        self.told.append((settings, replica_hooks))
        super().configure_training(settings, replica_hooks)


class Tiny(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("v", self.layer(batch[0]).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_trainer_tells_the_strategy_its_settings_and_the_training_batch_size():
    strategy = Recording()
    trainer = tf.Trainer(strategy=strategy, accelerator="cpu", max_steps=2, accumulate_grad_batches=2,
                         gradient_clip_val=0.5, gradient_clip_algorithm="value", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    loader = DataLoader(TensorDataset(torch.randn(12, 2)), batch_size=3)
    trainer.fit(Tiny(), loader)
    trainer.validate(dataloaders=loader, verbose=False)
    (fit_settings, fit_hooks), (val_settings, _) = strategy.told
    assert fit_settings == TrainingSettings(2, 0.5, "value", micro_batch_size=3)
    assert fit_hooks is REPLICA_LOGGING  # dp's replicas record self.log through the Trainer's hooks
    assert val_settings == TrainingSettings(2, 0.5, "value")  # no training loader outside fit
    assert strategy.training_settings == val_settings


def test_the_trainer_validates_through_the_settings():
    with pytest.raises(ConfigurationError, match="accumulate_grad_batches=0"):
        tf.Trainer(accumulate_grad_batches=0, accelerator="cpu")
    with pytest.raises(ConfigurationError, match="gradient_clip_algorithm='max'"):
        tf.Trainer(gradient_clip_algorithm="max", accelerator="cpu")
    assert tf.Trainer(accelerator="cpu", logger=False).gradient_clip_algorithm == "norm"


def test_fleet_tells_the_strategy_its_settings():
    strategy = Recording()
    settings = TrainingSettings(accumulate_grad_batches=4, gradient_clip_val=1.0, micro_batch_size=16)
    fleet = tf.Fleet(strategy=strategy, accelerator="cpu", training=settings)
    model = nn.Linear(2, 1)
    fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert strategy.told == [(settings, None)]
    # without training=, the defaults
    other = Recording()
    tf.Fleet(strategy=other, accelerator="cpu").setup(nn.Linear(2, 1))
    assert other.told == [(TrainingSettings(), None)]


def test_fleet_refuses_settings_of_another_type():
    with pytest.raises(ConfigurationError, match=r"training=\{'accumulate_grad_batches': 2\} is not valid"):
        tf.Fleet(accelerator="cpu", training={"accumulate_grad_batches": 2})


class _Stop(Exception):
    pass


def test_fleet_settings_fill_deepspeeds_config(monkeypatch):
    """Fleet(training=...) reaches DeepSpeed's "auto" entries (stopped before the engine is built)."""
    from torchfleet.strategies import _deepspeed_config as dsc
    from torchfleet.strategies import deepspeed as ds_module
    from torchfleet.strategies.deepspeed import DeepSpeedStrategy, deepspeed_available

    if not deepspeed_available():
        pytest.skip("deepspeed is not installed (the 'deepspeed' extra)")
    filled = {}
    real_fill_auto = dsc.fill_auto

    def fill_auto(config, **kwargs):
        filled.update(real_fill_auto(config, **kwargs)[0])
        raise _Stop

    monkeypatch.setattr(ds_module, "import_deepspeed", lambda *a, **k: None)  # nothing here imports deepspeed
    monkeypatch.setattr(dsc, "fill_auto", fill_auto)
    strategy = DeepSpeedStrategy()
    monkeypatch.setattr(strategy, "setup_environment", lambda: None)  # no process group in the test process
    fleet = tf.Fleet(strategy=strategy, accelerator="cpu", devices=1,
                     training=TrainingSettings(accumulate_grad_batches=4, gradient_clip_val=0.25, micro_batch_size=16))
    model = nn.Linear(2, 1)
    with pytest.raises(_Stop):
        fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert filled["gradient_accumulation_steps"] == 4
    assert filled["gradient_clipping"] == 0.25
    assert filled["train_micro_batch_size_per_gpu"] == 16
