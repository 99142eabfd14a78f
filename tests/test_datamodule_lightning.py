"""DataModule behaviours Lightning programs rely on: ``str(datamodule)`` lists the dataloaders of each stage, a
stage's dataloader the DataModule does not define is the model's, ``from_datasets`` builds Lightning's loaders."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import DataLoader

from tests.helpers import RegressionData, Regressor, loader, make_data, quiet
from torchfleet import DataModule, Trainer
from torchfleet.demos.boring_classes import BoringDataModule, BoringDataModuleNoLen, IterableBoringDataModule
from torchfleet.errors import ConfigurationError


def _lines(train: str, val: str, test: str, predict: str) -> str:
    return os.linesep.join([f"{{Train dataloader: {train}}}", f"{{Validation dataloader: {val}}}",
                            f"{{Test dataloader: {test}}}", f"{{Predict dataloader: {predict}}}"])


@pytest.mark.parametrize(("stage", "expected"), [
    (None, ("None", "None", "None", "None")),
    ("fit", ("size=64", "size=64", "None", "None")),
    ("validate", ("None", "size=64", "None", "None")),
    ("test", ("None", "None", "size=64", "None")),
    ("predict", ("None", "None", "None", "size=64")),
])
def test_str_lists_the_dataloaders_of_the_stages_set_up(stage, expected):
    dm = BoringDataModule()
    if stage is not None:
        dm.setup(stage)
    assert str(dm) == _lines(*expected)


def test_str_of_unsized_and_of_several_loaders():
    no_len = BoringDataModuleNoLen()
    no_len.setup("fit")
    assert str(no_len) == _lines("size=NA", "size=NA", "None", "None")
    several = IterableBoringDataModule()
    several.setup("fit")
    assert str(several) == _lines("1. size=16 ; 2. size=NA", "1. size=32 ; 2. size=NA", "None", "None")


def test_str_of_a_datamodule_whose_loader_fails_says_none():
    class Broken(RegressionData):
        def train_dataloader(self):
            raise RuntimeError("no data here yet")

    dm = Broken(n=8)
    dm.setup("fit")
    assert str(dm) == _lines("None", "size=4", "size=4", "None")


def test_a_datamodule_without_val_dataloader_means_no_validation():
    class TrainOnly(DataModule):
        def train_dataloader(self):
            return loader(n=16, batch_size=4)

    class ValidatedModel(Regressor):
        def val_dataloader(self):
            return DataLoader(make_data(12, seed=3), batch_size=4)

    trainer = Trainer(**quiet(max_epochs=1))
    trainer.fit(ValidatedModel(), datamodule=TrainOnly())
    # as Lightning (2.6.6 gives num_val_batches == []): the datamodule's hooks, not the model's, once one is given
    assert trainer.num_val_batches == [] and "val_loss" not in trainer.callback_metrics
    assert trainer.global_step == 4
    with pytest.raises(ConfigurationError, match="`test_dataloader` must be implemented.*TrainOnly defines no"):
        TrainOnly().test_dataloader()


def test_from_datasets_builds_lightnings_loaders():
    train, val = make_data(10), make_data(6, seed=1)
    dm = DataModule.from_datasets(train, val_dataset=[val, val], batch_size=4)
    loader_ = dm.train_dataloader()
    assert loader_.batch_size == 4 and loader_.pin_memory is True
    assert isinstance(loader_.sampler, torch.utils.data.RandomSampler)
    assert [len(v) for v in dm.val_dataloader()] == [2, 2]
    with pytest.raises(ConfigurationError, match="`predict_dataloader` must be implemented"):
        dm.predict_dataloader()


def test_validation_step_set_to_none_on_the_instance_turns_validation_off():
    model = Regressor()
    model.validation_step = None  # Lightning's way to skip validation for one run
    trainer = Trainer(**quiet(max_epochs=1))
    trainer.fit(model, loader(n=16), loader(n=8))
    assert trainer.num_val_batches == [] and "val_loss" not in trainer.callback_metrics
    assert trainer.global_step == 2
