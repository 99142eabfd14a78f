"""Trainer behaviour on one CPU device: loops, limits, accumulation, clipping, schedulers, hooks, errors."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

from tests.helpers import RegressionData, Regressor, loader, make_data, quiet
from torchfleet import Module, Trainer
from torchfleet.errors import ConfigurationError, MisconfiguredModuleError


def raw_sgd_run(model: nn.Module, batches, lr=0.05, momentum=0.9, accumulate=1, clip=None, epochs=1):
    """The reference: a hand-written PyTorch loop with the same optimizer."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for _ in range(epochs):
        for i, (x, y) in enumerate(batches):
            loss = nn.functional.mse_loss(model(x), y) / accumulate
            loss.backward()
            if (i + 1) % accumulate == 0 or i + 1 == len(batches):
                if clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                opt.zero_grad()
    return model


def test_fit_matches_hand_written_loop_bitwise():
    torch.manual_seed(0)
    model = Regressor()
    reference = copy.deepcopy(model)
    Trainer(max_epochs=2, **quiet()).fit(model, loader())
    raw_sgd_run(reference, list(loader()), epochs=2)
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("accumulate", [2, 3])
def test_gradient_accumulation_matches_reference(accumulate):
    torch.manual_seed(0)
    model = Regressor()
    reference = copy.deepcopy(model)
    trainer = Trainer(max_epochs=1, accumulate_grad_batches=accumulate, **quiet())
    trainer.fit(model, loader())
    raw_sgd_run(reference, list(loader()), accumulate=accumulate)
    assert trainer.global_step == -(-8 // accumulate)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_gradient_clipping_by_norm_matches_reference():
    torch.manual_seed(0)
    model = Regressor(lr=0.5)
    reference = copy.deepcopy(model)
    Trainer(max_epochs=1, gradient_clip_val=0.01, **quiet()).fit(model, loader())
    raw_sgd_run(reference, list(loader()), lr=0.5, clip=0.01)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_gradient_clipping_by_value_bounds_gradients():
    seen = []

    class Spy(Regressor):
        def on_before_optimizer_step(self, optimizer):
            pass

        def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
            seen.append(max(p.grad.abs().max().item() for p in self.parameters()))
            optimizer.zero_grad()

    Trainer(max_epochs=1, gradient_clip_val=1e-3, gradient_clip_algorithm="value", **quiet()).fit(Spy(lr=1.0), loader())
    assert seen and max(seen) <= 1e-3 + 1e-9


def test_limits_max_steps_and_global_step():
    trainer = Trainer(max_epochs=5, limit_train_batches=3, **quiet())
    trainer.fit(Regressor(), loader())
    assert trainer.global_step == 15 and trainer.current_epoch == 5
    trainer = Trainer(max_steps=7, **quiet())
    trainer.fit(Regressor(), loader())
    assert trainer.global_step == 7
    trainer = Trainer(max_epochs=1, limit_train_batches=0.5, **quiet())
    trainer.fit(Regressor(), loader())
    assert trainer.global_step == 4


def test_min_epochs_overrides_should_stop():
    class StopAtOnce(Regressor):
        def on_train_epoch_start(self):
            self.trainer.should_stop = True

    trainer = Trainer(max_epochs=10, min_epochs=3, **quiet())
    trainer.fit(StopAtOnce(), loader())
    # min_epochs=3 runs three whole epochs; the stop then leaves current_epoch 3, as max_epochs=3 would
    assert trainer.current_epoch == 3 and trainer.global_step == 3 * len(loader())


def test_validation_schedule_and_metrics():
    calls = []

    class Counting(Regressor):
        def on_validation_epoch_end(self):
            calls.append((self.current_epoch, self.global_step))

    trainer = Trainer(max_epochs=4, check_val_every_n_epoch=2, **quiet())
    trainer.fit(Counting(), datamodule=RegressionData())
    assert calls == [(1, 16), (3, 32)]
    assert "val_loss" in trainer.callback_metrics and "train_loss" in trainer.callback_metrics

    calls.clear()
    Trainer(max_epochs=1, val_check_interval=0.25, **quiet()).fit(Counting(), datamodule=RegressionData())
    assert calls == [(0, 2), (0, 4), (0, 6), (0, 8)]

    calls.clear()
    Trainer(max_epochs=1, val_check_interval=3, **quiet()).fit(Counting(), datamodule=RegressionData())
    assert calls == [(0, 3), (0, 6)]


def test_epoch_metric_is_sample_weighted_mean():
    class Logs(Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1))

        def validation_step(self, batch, batch_idx):
            (x,) = batch
            self.log("mean_x", x.mean())

    data = torch.utils.data.TensorDataset(torch.arange(10, dtype=torch.float32))
    out = Trainer(**quiet()).validate(Logs(), torch.utils.data.DataLoader(data, batch_size=4))
    # batches of 4, 4, 2: the weighted mean is the true mean 4.5 (a mean of batch means would be 4.83)
    assert out[0]["mean_x"] == pytest.approx(4.5)


def test_on_step_and_on_epoch_names():
    class Both(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("both", loss, on_step=True, on_epoch=True, prog_bar=True)
            return loss

    trainer = Trainer(max_epochs=1, log_every_n_steps=1, **quiet())
    trainer.fit(Both(), loader())
    assert "both" in trainer.callback_metrics
    assert "both_epoch" in trainer.logged_metrics
    assert "both_epoch" in trainer.progress_bar_metrics


def test_step_and_epoch_schedulers():
    trainer = Trainer(max_epochs=2, **quiet())
    model = Regressor(scheduler="step")
    trainer.fit(model, loader())
    # 16 steps, StepLR(step_size=3, gamma=0.5) stepped per optimizer step: 5 halvings
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05 * 0.5 ** 5)
    trainer = Trainer(max_epochs=3, **quiet())
    trainer.fit(Regressor(scheduler="epoch"), loader())
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05 * 0.5 ** 3)


def test_reduce_on_plateau_needs_logged_monitor():
    class Plateau(Regressor):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "nope"}}

    with pytest.raises(MisconfiguredModuleError, match="'nope'.*train_loss"):
        Trainer(max_epochs=1, **quiet()).fit(Plateau(), loader())


def test_training_step_none_skips_batch():
    class SkipOdd(Regressor):
        def training_step(self, batch, batch_idx):
            return None if batch_idx % 2 else super().training_step(batch, batch_idx)

    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(SkipOdd(), loader())
    assert trainer.global_step == 4


def test_training_step_dict_with_loss():
    class DictOut(Regressor):
        def training_step(self, batch, batch_idx):
            return {"loss": super().training_step(batch, batch_idx), "extra": 1}

    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(DictOut(), loader())
    assert trainer.global_step == 8


@pytest.mark.parametrize(
    "output, match",
    [
        (lambda loss: loss.item(), "returned a float"),
        (lambda loss: {"not_loss": loss}, "without 'loss'"),
        (lambda loss: loss.detach(), "does not require grad"),
        (lambda loss: torch.stack([loss, loss]), "shape"),
        (lambda loss: "loss", "returned a str"),
    ],
)
def test_bad_training_step_output(output, match):
    class Bad(Regressor):
        def training_step(self, batch, batch_idx):
            return output(super().training_step(batch, batch_idx))

    with pytest.raises(MisconfiguredModuleError, match=match):
        Trainer(max_epochs=1, **quiet()).fit(Bad(), loader())


@pytest.mark.parametrize(
    "config, match",
    [
        (lambda m: "adam", "not understood"),
        (lambda m: {"optim": torch.optim.SGD(m.parameters(), lr=1)}, "no 'optimizer'"),
        (lambda m: {"optimizer": 3}, "not a torch.optim.Optimizer"),
        (lambda m: {"optimizer": torch.optim.SGD(m.parameters(), lr=1), "lr_scheduler": 5}, "LR scheduler"),
        (lambda m: [torch.optim.SGD(m.parameters(), lr=1), torch.optim.SGD(m.parameters(), lr=1)], "automatic optimisation"),
    ],
)
def test_bad_optimizer_configuration(config, match):
    class Bad(Regressor):
        def configure_optimizers(self):
            return config(self)

    with pytest.raises(MisconfiguredModuleError, match=match):
        Trainer(max_epochs=1, **quiet()).fit(Bad(), loader())


def test_manual_optimization_two_optimizers():
    class GANish(Module):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.a = nn.Linear(8, 1)
            self.b = nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            opt_a, opt_b = self.optimizers()
            for opt, layer in ((opt_a, self.a), (opt_b, self.b)):
                opt.zero_grad()
                loss = nn.functional.mse_loss(layer(x), y)
                self.manual_backward(loss)
                opt.step()

        def configure_optimizers(self):
            return torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.1)

    model = GANish()
    before = copy.deepcopy(model.state_dict())
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(model, loader())
    assert trainer.global_step == 16  # two optimizer steps per batch
    assert not torch.equal(before["a.weight"], model.a.weight) and not torch.equal(before["b.weight"], model.b.weight)


def test_manual_backward_requires_manual_mode():
    class Wrong(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.manual_backward(loss)
            return loss

    with pytest.raises(ConfigurationError, match="automatic_optimization = False"):
        Trainer(max_epochs=1, **quiet()).fit(Wrong(), loader())


def test_hook_order():
    order = []
    names = ["on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start", "on_before_backward",
             "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_end",
             "on_validation_start", "on_validation_epoch_start", "on_validation_batch_start",
             "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end", "on_train_epoch_end",
             "on_train_end", "on_fit_end"]

    class Recorder(Regressor):
        pass

    for name in names:
        def hook(self, *args, _name=name):
            order.append(_name)
        setattr(Recorder, name, hook)
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, **quiet())
    trainer.fit(Recorder(), datamodule=RegressionData())
    assert order == names


def test_validate_test_predict():
    model = Regressor()
    trainer = Trainer(**quiet())
    val = trainer.validate(model, loader(32))
    test = trainer.test(model, loader(32))
    assert set(val[0]) == {"val_loss"} and set(test[0]) == {"test_loss"}
    assert val[0]["val_loss"] == pytest.approx(test[0]["test_loss"])
    preds = trainer.predict(model, loader(32))
    assert len(preds) == 4 and preds[0].shape == (8, 1)
    x = torch.cat([b[0] for b in loader(32)])
    torch.testing.assert_close(torch.cat(preds), model(x).detach())


def test_validate_with_two_dataloaders_suffixes_names():
    with pytest.raises(MisconfiguredModuleError, match="dataloader_idx"):
        Trainer(**quiet()).validate(Regressor(), [loader(16), loader(32, seed=3)])

    class TwoLoaders(Regressor):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            return super().validation_step(batch, batch_idx)

    out = Trainer(**quiet()).validate(TwoLoaders(), [loader(16), loader(32, seed=3)])
    assert len(out) == 2
    assert "val_loss/dataloader_idx_0" in out[0] and "val_loss/dataloader_idx_1" in out[1]


def test_fast_dev_run_runs_one_batch_and_writes_nothing(tmp_path):
    trainer = Trainer(accelerator="cpu", fast_dev_run=True, default_root_dir=tmp_path,
                      enable_progress_bar=False)
    trainer.fit(Regressor(), datamodule=RegressionData())
    assert trainer.global_step == 1
    assert list(tmp_path.iterdir()) == []


def test_sanity_check_runs_and_is_not_logged():
    steps = []

    class Spy(Regressor):
        def validation_step(self, batch, batch_idx):
            steps.append(self.trainer.sanity_checking)
            return super().validation_step(batch, batch_idx)

    trainer = Trainer(max_epochs=1, **{**quiet(), "num_sanity_val_steps": 2})
    trainer.fit(Spy(), datamodule=RegressionData())
    assert steps[:2] == [True, True] and steps[2:] == [False] * 4


def test_log_errors():
    class BadLog(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("vec", torch.ones(3))
            return loss

    with pytest.raises(MisconfiguredModuleError, match="shape"):
        Trainer(max_epochs=1, **quiet()).fit(BadLog(), loader())

    class BadReduce(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("x", loss, reduce_fx="median")
            return loss

    with pytest.raises(ConfigurationError, match="median"):
        Trainer(max_epochs=1, **quiet()).fit(BadReduce(), loader())


def test_trainer_reports_what_was_resolved():
    trainer = Trainer(devices=1, precision="bf16", **quiet(accelerator="cpu"))
    assert trainer.precision == "bf16-mixed"
    assert trainer.device_ids == [0] and trainer.num_devices == 1 and trainer.num_nodes == 1
    assert trainer.world_size == 1 and trainer.global_rank == 0 and trainer.local_rank == 0
    assert trainer.is_global_zero
    assert type(trainer.strategy).__name__ == "SingleDeviceStrategy"
    assert trainer.accelerator.name == "cpu"
    assert trainer.strategy.root_device == torch.device("cpu")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_epochs": -3}, "max_epochs"),
        ({"accumulate_grad_batches": 0}, "accumulate_grad_batches"),
        ({"val_check_interval": 1.5}, "val_check_interval"),
        ({"gradient_clip_algorithm": "l2"}, "'norm' and 'value'"),
        ({"limit_train_batches": 1.5}, "limit_train_batches"),
        ({"limit_val_batches": -1}, "limit_val_batches"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"deterministic": "yes"}, "deterministic"),
        ({"callbacks": [object()]}, "Callback"),
    ],
)
def test_bad_trainer_arguments(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        Trainer(**{**quiet(), **kwargs})


def test_fit_needs_module_and_data():
    with pytest.raises(ConfigurationError, match="torchfleet.Module"):
        Trainer(**quiet()).fit(nn.Linear(2, 2), loader())
    with pytest.raises(ConfigurationError, match="no training data"):
        Trainer(**quiet()).fit(Regressor())


def test_deterministic_mode_sets_torch_flag(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        Trainer(max_epochs=1, deterministic=True, **quiet()).fit(Regressor(), loader())
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        # cuBLAS refuses deterministic mode on CUDA without a workspace setting; the user's own choice is kept
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        Trainer(max_epochs=1, deterministic="warn", **quiet()).fit(Regressor(), loader())
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
        # a later Trainer that says False turns off what an earlier one in this process turned on
        Trainer(max_epochs=1, deterministic=False, **quiet()).fit(Regressor(), loader())
        assert not torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        Trainer(max_epochs=1, **quiet()).fit(Regressor(), loader())  # None leaves torch's setting alone
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_fit_twice_continues_training():
    model = Regressor()
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(model, loader())
    w1 = model.net[0].weight.detach().clone()
    trainer.fit(model, loader())
    assert not torch.equal(w1, model.net[0].weight)


def test_estimated_stepping_batches():
    seen = {}

    class Peek(Regressor):
        def configure_optimizers(self):
            seen["steps"] = self.trainer.estimated_stepping_batches
            return super().configure_optimizers()

    Trainer(max_epochs=3, accumulate_grad_batches=3, **quiet()).fit(Peek(), loader())
    assert seen["steps"] == 3 * 3  # ceil(8 / 3) = 3 steps per epoch


def test_lbfgs_gets_a_closure_that_recomputes():
    class WithLBFGS(Regressor):
        def configure_optimizers(self):
            return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=4)

    model = WithLBFGS()
    x, y = make_data(64).tensors
    before = nn.functional.mse_loss(model(x), y).item()
    calls = []
    original = WithLBFGS.training_step

    def counting(self, batch, batch_idx):
        calls.append(batch_idx)
        return original(self, batch, batch_idx)

    WithLBFGS.training_step = counting
    Trainer(max_epochs=2, **quiet()).fit(model, loader())
    after = nn.functional.mse_loss(model(x), y).item()
    assert after < before * 0.5
    assert len(calls) > 16  # LBFGS evaluated the loss several times per batch through the closure


class _TransferSpy(Regressor):
    """Records the three batch-transfer hooks and what each step receives (on_after_batch_transfer's mark)."""

    def __init__(self):
        super().__init__()
        self.log_calls = []

    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.log_calls.append(("before", dataloader_idx))
        return [*batch, "before"]

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        assert batch[-1] == "before"
        self.log_calls.append(("transfer", dataloader_idx))
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        assert batch[-1] == "before"
        self.log_calls.append(("after", dataloader_idx))
        return (*batch[:-1], f"after{dataloader_idx}")

    def _step(self, name, batch):
        *batch, mark = batch
        self.log_calls.append((name, mark, self.trainer.sanity_checking))
        return batch

    def training_step(self, batch, batch_idx):
        return super().training_step(self._step("training_step", batch), batch_idx)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        return super().validation_step(self._step("validation_step", batch), batch_idx)

    def test_step(self, batch, batch_idx):
        return super().test_step(self._step("test_step", batch), batch_idx)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return super().predict_step(self._step("predict_step", batch), batch_idx)


def _transferred(step, idx=0, sanity=False):
    return [("before", idx), ("transfer", idx), ("after", idx), (step, f"after{idx}", sanity)]


def test_batch_transfer_hooks_run_in_every_stage_with_the_loader_index():
    model = _TransferSpy()
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, **quiet(num_sanity_val_steps=1))
    trainer.fit(model, train_dataloaders=loader(32), val_dataloaders=[loader(16), loader(16, seed=3)])
    assert model.log_calls == (
        _transferred("validation_step", 0, True) + _transferred("validation_step", 1, True)
        + _transferred("training_step") * 2
        + _transferred("validation_step", 0) + _transferred("validation_step", 1)
    )

    model.log_calls.clear()
    out = Trainer(limit_val_batches=1, **quiet()).validate(model, [loader(16), loader(16, seed=3)])
    assert len(out) == 2
    assert model.log_calls == _transferred("validation_step", 0) + _transferred("validation_step", 1)

    model.log_calls.clear()
    Trainer(limit_test_batches=2, **quiet()).test(model, loader(32))
    assert model.log_calls == _transferred("test_step") * 2

    model.log_calls.clear()
    preds = Trainer(**quiet()).predict(model, [loader(8), loader(16, seed=3)])
    assert model.log_calls == _transferred("predict_step", 0) + _transferred("predict_step", 1) * 2
    assert [len(p) for p in preds] == [1, 2]


def test_datamodule_batch_transfer_hooks_run_before_the_modules_in_every_stage():
    calls = []

    class Data(RegressionData):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            calls.append(("dm_before", dataloader_idx))
            return batch

        def on_after_batch_transfer(self, batch, dataloader_idx):
            calls.append(("dm_after", dataloader_idx))
            return batch

    class Model(Regressor):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            calls.append(("before", dataloader_idx))
            return batch

        def on_after_batch_transfer(self, batch, dataloader_idx):
            calls.append(("after", dataloader_idx))
            return batch

    per_batch = [("dm_before", 0), ("before", 0), ("dm_after", 0), ("after", 0)]
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, **quiet(num_sanity_val_steps=1))
    trainer.fit(Model(), datamodule=Data())
    assert calls == per_batch * 3  # sanity check, one training batch, one validation batch
    for run in ("validate", "test"):
        calls.clear()
        getattr(Trainer(limit_val_batches=1, limit_test_batches=1, **quiet()), run)(Model(), datamodule=Data())
        assert calls == per_batch


def test_batch_transfer_without_overridden_hooks_is_the_strategys_move():
    from torchfleet.trainer.hooks import batch_transfer_fn

    trainer = Trainer(max_epochs=1, limit_train_batches=1, **quiet())
    trainer.fit(Regressor(), datamodule=RegressionData())  # a DataModule that keeps the pass-through hooks
    for idx in (0, 1):
        assert batch_transfer_fn(trainer, idx) == trainer.strategy.batch_to_device


# ------------------------------------------------------------------ Lightning parity: schedulers, validation, no-grad


class _ManualWithEpochScheduler(Regressor):
    """Manual optimisation that steps its epoch scheduler itself, as a ported Lightning model does."""

    def __init__(self):
        super().__init__(scheduler="epoch")  # StepLR(step_size=1, gamma=0.5)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(nn.functional.mse_loss(self(batch[0]), batch[1]))
        opt.step()

    def on_train_epoch_end(self):
        self.lr_schedulers().step()


def test_manual_optimisation_leaves_epoch_schedulers_to_the_user():
    trainer = Trainer(**quiet(max_epochs=3))
    trainer.fit(_ManualWithEpochScheduler(), datamodule=RegressionData())
    # the user's 3 steps only: 0.05 * 0.5**3
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05 * 0.5**3)
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 3


def test_manual_optimisation_leaves_step_schedulers_to_the_user_too():
    class Untouched(_ManualWithEpochScheduler):
        def __init__(self):
            Regressor.__init__(self, scheduler="step")  # StepLR(step_size=3, gamma=0.5), interval "step"
            self.automatic_optimization = False

        def on_train_epoch_end(self):
            pass  # the user never steps it

    trainer = Trainer(**quiet(max_epochs=2))
    trainer.fit(Untouched(), datamodule=RegressionData())
    assert trainer.global_step > 3  # enough optimizer steps for the scheduler to have lowered the lr
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 0
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05)


def test_check_val_every_n_epoch_none_counts_batches_across_epochs():
    seen = []

    class Record(Regressor):
        def on_validation_start(self):
            seen.append((self.current_epoch, self.global_step))

    # 64 samples / 8 = 8 batches per epoch; every 5 batches across epochs -> after batches 5, 10, 15, 20
    trainer = Trainer(**quiet(max_epochs=3, check_val_every_n_epoch=None, val_check_interval=5))
    trainer.fit(Record(), datamodule=RegressionData(shuffle=False))
    assert seen == [(0, 5), (1, 10), (1, 15), (2, 20)]
    # an interval longer than one epoch is fine there: after batches 12 and 24
    seen.clear()
    Trainer(**quiet(max_epochs=3, check_val_every_n_epoch=None, val_check_interval=12)).fit(
        Record(), datamodule=RegressionData(shuffle=False))
    assert seen == [(1, 12), (2, 24)]


@pytest.mark.parametrize("interval", [None, 0.5, 1.0])
def test_check_val_every_n_epoch_none_refuses_a_fraction(interval):
    with pytest.raises(ConfigurationError, match="should be an integer or a time-based duration.*val_check_interval=N"):
        Trainer(**quiet(check_val_every_n_epoch=None, val_check_interval=interval))


def test_evaluation_start_hooks_run_without_grad():
    from torchfleet.callbacks import Callback

    seen = {}

    def record(name):
        seen[name] = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())

    class Hooks(Regressor):
        def on_validation_start(self):
            record("module_validation")

        def on_test_start(self):
            record("module_test")

        def on_predict_start(self):
            record("module_predict")

    class CallbackHooks(Callback):
        def on_validation_start(self, trainer, module):
            record("cb_validation")

        def on_test_start(self, trainer, module):
            record("cb_test")

        def on_predict_start(self, trainer, module):
            record("cb_predict")

    model = Hooks()
    trainer = Trainer(**quiet(max_epochs=1, callbacks=[CallbackHooks()]))
    trainer.fit(model, datamodule=RegressionData())
    trainer.test(model, datamodule=RegressionData())
    trainer.predict(model, loader())
    names = [f"{who}_{stage}" for who in ("module", "cb") for stage in ("validation", "test", "predict")]
    assert seen == {name: (False, True) for name in names}  # inference_mode=True (the default)
    seen.clear()
    Trainer(**quiet(max_epochs=1, inference_mode=False, callbacks=[CallbackHooks()])).validate(
        model, datamodule=RegressionData())
    assert seen == {"module_validation": (False, False), "cb_validation": (False, False)}


def test_manual_optimizers_are_instances_of_the_wrapped_optimizer_class():
    # Lightning's ManualOptimBoringModel asserts this; LR schedulers built on self.optimizers() need it too
    seen = []

    class Manual(Regressor):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            seen.append((isinstance(opt, torch.optim.Optimizer), isinstance(opt, torch.optim.SGD), opt.optimizer))
            x, y = batch
            opt.zero_grad()
            self.manual_backward(nn.functional.mse_loss(self(x), y))
            opt.step()

    trainer = Trainer(max_steps=2, **quiet())
    trainer.fit(Manual(), loader())
    assert [s[:2] for s in seen] == [(True, True), (True, True)]
    assert seen[0][2] is trainer.optimizers[0] and trainer.global_step == 2


def test_model_eval_and_train_hooks_decide_the_mode_around_evaluation():
    # Monte-Carlo dropout, as Lightning users write it: dropout stays on while the rest is in eval mode
    calls = []

    class MCDropout(Regressor):
        def __init__(self):
            super().__init__(dropout=0.5)
            self.modes: dict[str, set] = {}

        def _keep_dropout(self, name):
            calls.append(name)
            self.eval()
            for m in self.modules():
                if isinstance(m, nn.Dropout):
                    m.train()

        def on_validation_model_eval(self):
            self._keep_dropout("validation_eval")

        def on_validation_model_train(self):
            calls.append("validation_train")
            super().on_validation_model_train()

        def on_test_model_eval(self):
            self._keep_dropout("test_eval")

        def on_predict_model_eval(self):
            calls.append("predict_eval")
            super().on_predict_model_eval()

        def _note(self, stage):
            self.modes.setdefault(stage, set()).add(
                (self.training, any(m.training for m in self.modules() if isinstance(m, nn.Dropout))))

        def validation_step(self, batch, batch_idx):
            self._note("validate")

        def test_step(self, batch, batch_idx):
            self._note("test")

        def predict_step(self, batch, batch_idx):
            self._note("predict")

        def training_step(self, batch, batch_idx):
            self._note("train")
            return super().training_step(batch, batch_idx)

    model = MCDropout()
    trainer = Trainer(**quiet(max_epochs=2))
    trainer.fit(model, loader(16), loader(16))
    trainer.test(model, loader(16), verbose=False)
    trainer.predict(model, loader(16))
    assert model.modes == {"train": {(True, True)}, "validate": {(False, True)}, "test": {(False, True)},
                           "predict": {(False, False)}}
    # after each of the 2 validations in fit the module is put back to training by its hook
    assert calls == ["validation_eval", "validation_train"] * 2 + ["test_eval", "predict_eval"]


def test_a_module_backward_override_runs_the_backward():
    # Lightning calls LightningModule.backward(loss) for the Trainer's backward and for manual_backward
    class OwnBackward(Regressor):
        def __init__(self):
            super().__init__()
            self.losses, self.step_losses = [], []

        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.step_losses.append(loss.item())
            return loss

        def backward(self, loss, *args, **kwargs):
            self.losses.append(loss.detach().clone())
            loss.backward(*args, retain_graph=True, **kwargs)  # e.g. to look at the graph afterwards

    model = OwnBackward()
    trainer = Trainer(**quiet(max_epochs=1, accumulate_grad_batches=2))
    trainer.fit(model, loader(32))
    assert len(model.losses) == 4 and trainer.global_step == 2
    # it receives the loss the Trainer backpropagates: training_step's, divided by accumulate_grad_batches
    assert torch.stack(model.losses).tolist() == pytest.approx([v / 2 for v in model.step_losses], rel=1e-6)
    assert trainer.strategy.precision.module_backward is None  # only during the stage

    class ManualOwnBackward(OwnBackward):
        training_step = _ManualWithEpochScheduler.training_step  # zero_grad, manual_backward, step

        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

    manual = ManualOwnBackward()
    Trainer(**quiet(max_steps=3)).fit(manual, loader(32))
    assert len(manual.losses) == 3


def test_a_backward_override_under_a_strategy_with_its_own_backward_is_warned_about():
    # DeepSpeed's engine runs the backward itself (backward_through_precision False): the override cannot run
    from torchfleet.strategies import DeepSpeedStrategy, SingleDeviceStrategy

    assert DeepSpeedStrategy.backward_through_precision is False

    class EngineBackward(SingleDeviceStrategy):
        backward_through_precision = False

        def backward(self, loss, module=None, *args, **kwargs):
            loss.backward()

    class OwnBackward(Regressor):
        calls = 0

        def backward(self, loss, *args, **kwargs):
            OwnBackward.calls += 1

    with pytest.warns(UserWarning, match="OwnBackward overrides backward\\(\\), which EngineBackward does not call"):
        Trainer(**quiet(max_steps=2, strategy=EngineBackward(device=torch.device("cpu")))).fit(OwnBackward(), loader())
    assert OwnBackward.calls == 0
