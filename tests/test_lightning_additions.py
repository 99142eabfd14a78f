"""Names added so that Lightning programs find them (tests/test_lightning_names.py lists the rest), each behaving as
Lightning's: strict_loading, to_torchscript/to_onnx, configure_sharded_model, prepare_data_per_node,
DataModule.from_datasets/on_exception/transfer_batch_to_device, Trainer.received_sigterm/enable_validation/
evaluating/scaler/distributed_sampler_kwargs, Fleet.init_tensor/accelerator."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch import nn

import torchfleet as tf
from tests.helpers import RegressionData, Regressor, loader, make_data, quiet
from torchfleet.errors import CheckpointError, ConfigurationError
from torchfleet.preemption import Preempted
from torchfleet.strategies import SingleDeviceStrategy


class PartlySaved(Regressor):
    """Lightning's strict_loading example: a frozen part left out of checkpoints."""

    def __init__(self, strict: bool | None = None, **kwargs):
        super().__init__(**kwargs)
        self.frozen = nn.Linear(8, 8).requires_grad_(False)
        if strict is not None:
            self.strict_loading = strict

    def on_save_checkpoint(self, checkpoint):
        for key in [k for k in checkpoint["state_dict"] if k.startswith("frozen.")]:
            del checkpoint["state_dict"][key]


def test_strict_loading_lets_a_checkpoint_leave_weights_out(tmp_path):
    trainer = tf.Trainer(**quiet(max_epochs=1, default_root_dir=tmp_path))
    trainer.fit(PartlySaved(), loader(16))
    path = str(tmp_path / "partial.ckpt")
    trainer.save_checkpoint(path)
    assert PartlySaved().strict_loading and not PartlySaved(strict=False).strict_loading
    with pytest.raises(CheckpointError, match="frozen"):
        tf.Trainer(**quiet(max_epochs=2)).fit(PartlySaved(), loader(16), ckpt_path=path)
    resumed = PartlySaved(strict=False)
    frozen = resumed.frozen.weight.detach().clone()
    tf.Trainer(**quiet(max_epochs=2)).fit(resumed, loader(16), ckpt_path=path)
    assert torch.equal(resumed.frozen.weight, frozen)  # kept its own: the checkpoint has none
    with pytest.raises(CheckpointError):
        PartlySaved.load_from_checkpoint(path)
    assert PartlySaved.load_from_checkpoint(path, strict=False).hparams.hidden == 16


def test_to_torchscript_scripts_or_traces_and_keeps_the_mode(tmp_path):
    model = Regressor()
    x = torch.randn(4, 8)
    scripted = model.to_torchscript(file_path=tmp_path / "m.pt")
    assert model.training  # put back after compiling in eval mode
    torch.testing.assert_close(torch.jit.load(tmp_path / "m.pt")(x), model.eval()(x))
    with pytest.raises(ConfigurationError, match="example_input_array"):
        Regressor().to_torchscript(method="trace")
    model.example_input_array = x
    traced = model.to_torchscript(method="trace")
    torch.testing.assert_close(traced(x), scripted(x))
    with pytest.raises(ConfigurationError, match="'script' and 'trace'"):
        model.to_torchscript(method="compile")


def test_to_onnx_exports_or_says_what_it_needs(tmp_path):
    model = Regressor()
    model.example_input_array = torch.randn(2, 8)
    try:
        import onnx  # noqa: F401
    except ImportError:
        with pytest.raises(ModuleNotFoundError, match="pip install onnx"):
            model.to_onnx(tmp_path / "m.onnx")
        return
    model.to_onnx(tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx").stat().st_size > 0


def test_configure_sharded_model_runs_as_configure_model():
    class Legacy(Regressor):
        def configure_sharded_model(self):
            self.head = nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.head(self(x)), y)

    model = Legacy()
    trainer = tf.Trainer(**quiet(max_epochs=1))
    with pytest.warns(DeprecationWarning, match="configure_model"):
        trainer.fit(model, loader(16))
    trained = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert isinstance(model.head, nn.Linear) and id(model.head.weight) in trained


class _NodeOneFirstProcess(SingleDeviceStrategy):
    """One process as it stands on the second machine of a job: local rank 0, global rank 4."""

    @property
    def global_rank(self) -> int:
        return 4


class Preparing(RegressionData):
    calls = 0

    def prepare_data(self):
        Preparing.calls += 1


@pytest.mark.parametrize("per_node,called", [(True, 1), (False, 0)])
def test_prepare_data_per_node(per_node, called):
    Preparing.calls = 0
    data = Preparing()
    data.prepare_data_per_node = per_node
    trainer = tf.Trainer(strategy=_NodeOneFirstProcess(device="cpu"), **quiet(max_epochs=1, limit_train_batches=1))
    trainer.fit(Regressor(), datamodule=data)
    assert Preparing.calls == called


def test_prepare_data_of_module_and_datamodule_both_run():
    seen = []

    class Model(Regressor):
        def prepare_data(self):
            seen.append("module")

    class Data(RegressionData):
        def prepare_data(self):
            seen.append("datamodule")

    tf.Trainer(**quiet(max_epochs=1, limit_train_batches=1)).fit(Model(), datamodule=Data())
    assert seen == ["datamodule", "module"]


def test_datamodule_from_datasets():
    train, val = make_data(32), make_data(16, seed=1)
    dm = tf.DataModule.from_datasets(train, val_dataset={"a": val, "b": val}, batch_size=8)
    batches = list(dm.train_dataloader())
    assert len(batches) == 4 and batches[0][0].shape == (8, 8)
    assert sorted(torch.cat([b[0] for b in batches]).sum(1).tolist()) == sorted(train.tensors[0].sum(1).tolist())
    assert set(dm.val_dataloader()) == {"a", "b"} and len(dm.val_dataloader()["a"]) == 2

    class Sized(tf.DataModule):
        def __init__(self, batch_size, extra):
            super().__init__()
            self.batch_size, self.extra = batch_size, extra

    made = Sized.from_datasets(train, batch_size=4, extra="x")
    assert (made.batch_size, made.extra) == (4, "x")
    trainer = tf.Trainer(**quiet(max_epochs=1))
    trainer.fit(Regressor(), datamodule=tf.DataModule.from_datasets(train, val, batch_size=8))
    assert trainer.num_training_batches == 4 and trainer.num_val_batches == [2]


def test_datamodule_on_exception_and_its_own_transfer():
    class Data(RegressionData):
        def __init__(self):
            super().__init__()
            self.errors, self.moved = [], 0

        def on_exception(self, exception):
            self.errors.append(exception)

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            self.moved += 1
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

    class Failing(Regressor):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                raise ValueError("bad batch")
            return super().training_step(batch, batch_idx)

    data = Data()
    with pytest.raises(ValueError, match="bad batch"):
        tf.Trainer(**quiet(max_epochs=1)).fit(Failing(), datamodule=data)
    assert [str(e) for e in data.errors] == ["bad batch"] and data.moved == 3


def test_received_sigterm_during_and_after_fit(tmp_path):
    class Signalled(Regressor):
        seen = []

        def on_train_batch_end(self, outputs, batch, batch_idx):
            Signalled.seen.append(self.trainer.received_sigterm)
            if batch_idx == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = tf.Trainer(**quiet(max_epochs=1, default_root_dir=tmp_path))
    assert not trainer.received_sigterm
    with pytest.raises(Preempted):
        trainer.fit(Signalled(), loader(64))
    assert Signalled.seen[:2] == [False, False] and Signalled.seen[2:] == [True] * (len(Signalled.seen) - 2)
    assert trainer.received_sigterm
    trainer2 = tf.Trainer(**quiet(max_epochs=1))
    trainer2.fit(Regressor(), loader(16))
    assert not trainer2.received_sigterm


def test_trainer_state_names():
    seen = {}

    class Model(Regressor):
        def validation_step(self, batch, batch_idx):
            seen.setdefault("validation", (self.trainer.evaluating, self.trainer.training))
            return super().validation_step(batch, batch_idx)

        def training_step(self, batch, batch_idx):
            seen.setdefault("training", (self.trainer.evaluating, self.trainer.training))
            return super().training_step(batch, batch_idx)

    trainer = tf.Trainer(**quiet(max_epochs=1))
    assert not trainer.enable_validation  # nothing to validate with yet
    model = Model()
    trainer.fit(model, loader(16), loader(8))
    assert seen == {"validation": (True, False), "training": (False, True)}
    assert trainer.enable_validation
    assert not tf.Trainer(**quiet(limit_val_batches=0)).enable_validation
    assert trainer.scaler is None and trainer.distributed_sampler_kwargs is None
    ddp = tf.Trainer(strategy="ddp", devices=2, **quiet())
    assert ddp.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 0}


def test_fleet_init_tensor_and_accelerator():
    fleet = tf.Fleet(accelerator="cpu", devices=1, precision="bf16-true")
    with fleet.init_tensor():
        made = torch.ones(2)
    assert made.dtype == torch.bfloat16 and made.device.type == "cpu"
    assert fleet.accelerator is fleet.strategy.accelerator and fleet.accelerator is not None
    model = Regressor()
    assert not model.on_gpu and model.fabric is None
    fleet.setup(model)
    assert model.fabric is fleet


def test_checkpoint_hyperparameter_key_is_where_they_are_saved(tmp_path):
    trainer = tf.Trainer(**quiet(max_epochs=1))
    trainer.fit(Regressor(hidden=7), loader(16))
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    saved = torch.load(tmp_path / "c.ckpt", weights_only=True)
    assert saved[tf.Module.CHECKPOINT_HYPER_PARAMS_KEY]["hidden"] == 7
    assert tf.DataModule.CHECKPOINT_HYPER_PARAMS_KEY == tf.Module.CHECKPOINT_HYPER_PARAMS_KEY


class _Recorder(tf.loggers.Logger):
    """A logger that keeps what it was given, called as Fabric calls one (log_metrics(metrics=..., step=...))."""

    def __init__(self):
        self.calls = []

    @property
    def name(self):
        return "recorder"

    @property
    def version(self):
        return 0

    def log_metrics(self, metrics, step=None):
        self.calls.append((dict(metrics), step))


def test_a_module_logs_through_its_fleet_as_under_fabric():
    recorder = _Recorder()
    fleet = tf.Fleet(accelerator="cpu", loggers=[recorder])
    model = fleet.setup(Regressor())
    model.log("int", 3)
    model.log("tensor", torch.tensor(0.5))
    model.log_dict({"a": 1, "b": torch.tensor(2.0)})  # one call for the whole dict, as Fabric makes
    model.log("hidden", 1.0, logger=False)
    assert recorder.calls == [({"int": 3}, None), ({"tensor": 0.5}, None), ({"a": 1, "b": 2.0}, None)]
    assert type(recorder.calls[0][0]["int"]) is int  # kept as given (Fabric converts tensors only)
    with pytest.raises(ConfigurationError, match="`list` values cannot be logged"):
        model.log("bad", [1, 2])
    with pytest.raises(ConfigurationError, match="nested dictionaries cannot be logged"):
        model.log_dict({"nested": {"x": 1}})
    with pytest.raises(ConfigurationError, match="`str` values cannot be logged"):
        fleet.log("text", "0.5")
    assert len(recorder.calls) == 3


def test_a_modules_ranks_are_read_from_its_trainer():
    from unittest.mock import Mock

    model = Regressor()
    assert (model.global_rank, model.local_rank) == (0, 0)
    model.trainer = Mock(global_rank=3, local_rank=1)  # a Trainer-like object, as Lightning's tests attach
    assert (model.global_rank, model.local_rank) == (3, 1)
