"""Trainer arguments Lightning programs pass: ``barebones``, ``detect_anomaly`` and
``reload_dataloaders_every_n_epochs``, each behaving as Lightning's (the reload order is compared with Lightning's
own run where the reference Lightning is installed)."""

from __future__ import annotations

import json
import logging
import os
import textwrap

import pytest
import torch

from tests.helpers import Regressor, loader, quiet
from tests.lightning_reference import needs_lightning, run_in_lightning
from torchfleet import Trainer
from torchfleet.callbacks import ModelCheckpoint, ModelSummary, ProgressBar
from torchfleet.errors import ConfigurationError
from torchfleet.profilers import PassThroughProfiler


def test_barebones_switches_off_what_costs_speed(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="torchfleet"):
        trainer = Trainer(barebones=True, accelerator="cpu", max_epochs=2)
    assert "running in `Trainer(barebones=True)` mode" in caplog.text
    assert trainer.barebones and not trainer.loggers and trainer.logger is None
    assert not any(isinstance(c, (ModelCheckpoint, ProgressBar, ModelSummary)) for c in trainer.callbacks)
    assert trainer.log_every_n_steps == 0 and trainer.num_sanity_val_steps == 0
    assert isinstance(trainer.profiler, PassThroughProfiler)
    model = Regressor()
    with pytest.warns(UserWarning, match=r"`Trainer\(barebones=True\)` is configured"):
        trainer.fit(model, loader(n=16), loader(n=8))
    assert trainer.global_step == 4  # it trains ...
    assert trainer.callback_metrics == {} and trainer.logged_metrics == {}  # ... and self.log records nothing
    assert os.listdir(tmp_path) == []  # no checkpoint, no log folder


@pytest.mark.parametrize(("name", "value"), [
    ("enable_checkpointing", True), ("logger", True), ("enable_progress_bar", True), ("enable_model_summary", True),
    ("log_every_n_steps", 1), ("num_sanity_val_steps", 1), ("fast_dev_run", 1), ("detect_anomaly", True),
    ("profiler", "simple"),
])
def test_barebones_refuses_what_it_switches_off(name, value):
    with pytest.raises(ConfigurationError, match=rf"`Trainer\(barebones=True, {name}={value!r}\)` was passed"):
        Trainer(barebones=True, accelerator="cpu", **{name: value})
    # the values that mean "off" are accepted with it
    off = {"logger": False, "profiler": None, "log_every_n_steps": 0, "num_sanity_val_steps": 0, "fast_dev_run": 0}
    Trainer(barebones=True, accelerator="cpu", **{name: off.get(name, False)})


def test_detect_anomaly_names_the_operation_that_made_a_nan():
    class NaNBackward(Regressor):
        def training_step(self, batch, batch_idx):
            return torch.sqrt(self(batch[0]) * 0 - 1).nan_to_num().sum()  # sqrt(-1): NaN in backward

    # without it the step runs (the NaN gradient goes unnoticed) ...
    Trainer(**quiet(max_steps=1)).fit(NaNBackward(), loader(n=8))
    # ... with it autograd stops at the operation, and the mode ends with the run
    with pytest.raises(RuntimeError, match="SqrtBackward0.*returned nan"):
        Trainer(**quiet(max_steps=1, detect_anomaly=True)).fit(NaNBackward(), loader(n=8))
    assert not torch.is_anomaly_enabled()


#: the same text under either library, after its own import lines: when each dataloader is asked for
RELOAD_PROGRAM = textwrap.dedent("""
    from torch.utils.data import DataLoader

    calls = []

    class Model(BoringModel):
        def train_dataloader(self):
            calls.append(("train", self.trainer.current_epoch))
            return DataLoader(RandomDataset(32, 8 + 2 * self.trainer.current_epoch), batch_size=2)

        def val_dataloader(self):
            calls.append(("val", self.trainer.current_epoch))
            return DataLoader(RandomDataset(32, 4 + self.trainer.current_epoch), batch_size=2)

        def on_train_epoch_start(self):
            calls.append(("epoch", self.trainer.current_epoch, self.trainer.num_training_batches))

        def on_validation_epoch_start(self):
            if not self.trainer.sanity_checking:
                calls.append(("validate", self.trainer.current_epoch, self.trainer.num_val_batches))

    def run(every, check_val):
        calls.clear()
        trainer = Trainer(max_epochs=5, reload_dataloaders_every_n_epochs=every, check_val_every_n_epoch=check_val,
                          accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False)
        trainer.fit(Model())
        return [list(c) for c in calls]

    results = {f"{every}-{check}": run(every, check) for every, check in ((2, 1), (1, 2), (0, 1))}
""")
TORCHFLEET = "from torchfleet import Trainer\nfrom torchfleet.demos.boring_classes import BoringModel, RandomDataset\n"
LIGHTNING = "from lightning.pytorch import Trainer\nfrom lightning.pytorch.demos.boring_classes import BoringModel, " \
            "RandomDataset\n"


@pytest.fixture(scope="module")
def reload_calls() -> dict:
    namespace: dict = {}
    exec(compile(TORCHFLEET + RELOAD_PROGRAM, "reload_program", "exec"), namespace)
    return namespace["results"]


def test_reload_dataloaders_every_n_epochs_asks_again(reload_calls):
    every_2 = reload_calls["2-1"]
    assert [c[1] for c in every_2 if c[0] == "train"] == [0, 2, 4]
    assert [c[1] for c in every_2 if c[0] == "val"] == [0, 2, 4]  # when validation runs in a due epoch
    # each epoch trains on the loader asked for last: 8, 12 and 16 samples of batch 2
    assert [c[2] for c in every_2 if c[0] == "epoch"] == [4, 4, 6, 6, 8]
    assert [c[2] for c in every_2 if c[0] == "validate"] == [[2], [2], [3], [3], [4]]
    # validating every second epoch, reloading every epoch: the validation loaders are asked for when validating
    assert [c[1] for c in reload_calls["1-2"] if c[0] == "val"] == [0, 1, 3]
    assert [c[1] for c in reload_calls["0-1"] if c[0] in ("train", "val")] == [0, 0]  # 0: once per fit


@needs_lightning
def test_reload_order_equals_lightnings(reload_calls, tmp_path):
    out = run_in_lightning(LIGHTNING + RELOAD_PROGRAM + "\nimport json\nprint('RESULTS', json.dumps(results))\n")
    theirs = json.loads(out.split("RESULTS ", 1)[1])
    assert json.loads(json.dumps(reload_calls)) == theirs


def test_reload_dataloaders_every_n_epochs_is_checked():
    with pytest.raises(ConfigurationError, match="reload_dataloaders_every_n_epochs=-1"):
        Trainer(accelerator="cpu", reload_dataloaders_every_n_epochs=-1)


def test_logger_and_loggers_can_be_replaced(tmp_path):
    from torchfleet.loggers import CSVLogger

    first, second = CSVLogger(tmp_path, name="a"), CSVLogger(tmp_path, name="b")
    trainer = Trainer(**quiet(max_epochs=1, log_every_n_steps=1))
    trainer.logger = first
    assert trainer.loggers == [first] and trainer.logger is first
    trainer.loggers = [second, first]
    assert trainer.logger is second
    trainer.loggers = None
    assert trainer.loggers == [] and trainer.logger is None
    trainer.logger = second  # a logger set after construction is the one a run writes to
    trainer.fit(Regressor(), loader(n=8))
    assert os.path.isfile(os.path.join(second.log_dir, "metrics.csv"))
    trainer.logger = None
    assert trainer.loggers == []


def test_fast_dev_run_keeps_code_that_uses_the_logger_running(tmp_path):
    from torchfleet.callbacks import EarlyStopping
    from torchfleet.loggers import DummyLogger, TensorBoardLogger

    class UsesTheLogger(Regressor):
        def training_step(self, batch, batch_idx):
            # TensorBoard's API, and another logger's method: both do nothing under fast_dev_run, as in Lightning
            self.logger.experiment.add_histogram("w", self.net[0].weight, self.global_step)
            self.logger.log_image(key="samples", images=[])
            return super().training_step(batch, batch_idx)

    given = TensorBoardLogger(tmp_path)
    trainer = Trainer(accelerator="cpu", fast_dev_run=2, logger=given, default_root_dir=tmp_path,
                      enable_progress_bar=False, callbacks=[EarlyStopping(monitor="never_logged")])
    trainer.fit(UsesTheLogger(), loader(n=32), loader(n=16))
    assert isinstance(trainer.logger, DummyLogger) and trainer.logger[0] is trainer.logger
    assert trainer.global_step == 2
    assert not os.path.exists(given.log_dir)  # nothing written; EarlyStopping skipped its (failing) check
    assert Trainer(accelerator="cpu", fast_dev_run=True, logger=False).loggers == []
