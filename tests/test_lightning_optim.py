"""Lightning-parity optimisation features: toggle_optimizer, the optimizer_idx error, lr_scheduler_step,
non-torch schedulers, 'strict' in a scheduler dict and self.lr_schedulers() in manual optimisation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers import RegressionData, Regressor, loader, quiet
from torchfleet import Module, Trainer
from torchfleet.errors import MisconfiguredModuleError


class Halver:
    """A scheduler that is no torch LRScheduler: halves the learning rate on ``halve()``."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.calls = 0

    def halve(self):
        self.calls += 1
        for g in self.optimizer.param_groups:
            g["lr"] *= 0.5

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


class GAN(Module):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.gen = nn.Linear(8, 8)
        self.disc = nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 1))
        self.disc[2].bias.requires_grad = False  # frozen before toggling: must stay frozen
        self.seen = []

    def flags(self):
        return {n: p.requires_grad for n, p in self.named_parameters()}

    def training_step(self, batch, batch_idx):
        x, _ = batch
        opt_g, opt_d = self.optimizers()
        before = self.flags()
        # discriminator step: only the discriminator's parameters may get gradients
        self.toggle_optimizer(opt_d)
        toggled_d = self.flags()
        opt_g.zero_grad()
        opt_d.zero_grad()
        d_loss = self.disc(self.gen(x)).mean() - self.disc(x).mean()
        self.manual_backward(d_loss)
        grads_d = {n: p.grad is not None for n, p in self.named_parameters()}
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        after_d = self.flags()
        # generator step through the context manager
        with self.toggled_optimizer(opt_g):
            toggled_g = self.flags()
            opt_g.zero_grad()
            opt_d.zero_grad()
            g_loss = -self.disc(self.gen(x)).mean()
            self.manual_backward(g_loss)
            grads_g = {n: p.grad is not None for n, p in self.named_parameters()}
            opt_g.step()
        self.seen.append((before, toggled_d, grads_d, after_d, toggled_g, grads_g, self.flags()))

    def configure_optimizers(self):
        return [torch.optim.SGD(self.gen.parameters(), lr=0.01),
                torch.optim.SGD([p for p in self.disc.parameters()], lr=0.01)]


def test_toggle_optimizer_gives_gradients_only_to_the_toggled_optimizer():
    model = GAN()
    Trainer(**quiet(max_epochs=1, limit_train_batches=3)).fit(model, loader())
    assert len(model.seen) == 3
    gen = {"gen.weight", "gen.bias"}
    disc_trainable = {"disc.0.weight", "disc.0.bias", "disc.2.weight"}
    initial = {**dict.fromkeys(gen | disc_trainable, True), "disc.2.bias": False}
    for before, toggled_d, grads_d, after_d, toggled_g, grads_g, final in model.seen:
        assert before == initial
        assert toggled_d == {**dict.fromkeys(gen, False), **dict.fromkeys(disc_trainable, True), "disc.2.bias": False}
        assert {n for n, g in grads_d.items() if g} == disc_trainable
        assert after_d == initial
        assert toggled_g == {**dict.fromkeys(gen, True), **dict.fromkeys(disc_trainable | {"disc.2.bias"}, False)}
        assert {n for n, g in grads_g.items() if g} == gen
        assert final == initial


def test_toggled_optimizer_restores_flags_on_error():
    model = GAN()
    trainer = Trainer(**quiet(max_epochs=1, limit_train_batches=1))
    trainer.fit(model, loader())
    opt_g = trainer.optimizers[0]
    model.trainer = trainer
    with pytest.raises(RuntimeError, match="boom"), model.toggled_optimizer(opt_g):
        assert not model.disc[0].weight.requires_grad
        raise RuntimeError("boom")
    assert model.disc[0].weight.requires_grad and not model.disc[2].bias.requires_grad


def test_training_step_with_optimizer_idx_fails_at_fit_start():
    configured = []

    class OldStyle(Regressor):
        def training_step(self, batch, batch_idx, optimizer_idx):
            raise AssertionError("must not run")

        def configure_optimizers(self):
            configured.append(1)
            return super().configure_optimizers()

    with pytest.raises(MisconfiguredModuleError, match=r"optimizer_idx.*Lightning 2 removed.*"
                       r"automatic_optimization = False.*self\.optimizers\(\).*toggle_optimizer"):
        Trainer(**quiet(max_epochs=1)).fit(OldStyle(), datamodule=RegressionData())
    assert configured == []


def test_lr_scheduler_step_replaces_scheduler_step():
    calls = []

    class Custom(Regressor):
        def validation_step(self, batch, batch_idx):
            self.log("val_metric", 10.0 + self.current_epoch)

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.05)
            self.step_lr = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
            self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
            return [opt], [{"scheduler": self.step_lr, "interval": "step", "frequency": 2},
                           {"scheduler": self.plateau, "monitor": "val_metric"}]

        def lr_scheduler_step(self, scheduler, metric):
            calls.append((scheduler, None if metric is None else float(metric), self.global_step))

    model = Custom()
    trainer = Trainer(**quiet(max_epochs=3, limit_train_batches=4, limit_val_batches=2))
    trainer.fit(model, datamodule=RegressionData())
    # 4 steps per epoch, every 2nd step: steps 2, 4, 6, ..., 12; the plateau scheduler once per epoch, after validation
    step_calls = [(s, m, g) for s, m, g in calls if s is model.step_lr]
    plateau_calls = [(s, m, g) for s, m, g in calls if s is model.plateau]
    assert [(m, g) for _, m, g in step_calls] == [(None, g) for g in (2, 4, 6, 8, 10, 12)]
    assert [(m, g) for _, m, g in plateau_calls] == [(10.0, 4), (11.0, 8), (12.0, 12)]
    assert len(calls) == 9
    # the hook replaced scheduler.step(): the learning rate never changed
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.05
    assert model.step_lr.last_epoch == 0


class _WithHalver(Regressor):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.08)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": Halver(opt), "interval": "epoch"}}


def test_non_torch_scheduler_works_through_lr_scheduler_step():
    class Stepped(_WithHalver):
        def lr_scheduler_step(self, scheduler, metric):
            assert metric is None
            scheduler.halve()

    trainer = Trainer(**quiet(max_epochs=3, limit_train_batches=2))
    trainer.fit(Stepped(), datamodule=RegressionData())
    assert trainer.lr_scheduler_configs[0].scheduler.calls == 3
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.08 / 8)


def test_non_torch_scheduler_without_lr_scheduler_step_fails_clearly():
    with pytest.raises(MisconfiguredModuleError, match=r"Halver is not a torch.*Override lr_scheduler_step"):
        Trainer(**quiet(max_epochs=1)).fit(_WithHalver(), datamodule=RegressionData())


def _plateau_on(metric, **extra):
    class Plateau(Regressor):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.05)
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": metric, **extra}}

    return Plateau()


def test_strict_false_skips_a_missing_monitor_with_a_warning():
    trainer = Trainer(**quiet(max_epochs=2, limit_train_batches=2))
    with pytest.warns(RuntimeWarning, match="'not_logged'.*strict"):
        trainer.fit(_plateau_on("not_logged", strict=False), datamodule=RegressionData())
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.05
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 0  # never stepped


def test_strict_default_raises_naming_the_missing_monitor():
    with pytest.raises(MisconfiguredModuleError, match="'not_logged', which was not logged"):
        Trainer(**quiet(max_epochs=1, limit_train_batches=2)).fit(_plateau_on("not_logged"), datamodule=RegressionData())


def test_manual_optimisation_lr_schedulers_includes_plateau_and_custom():
    class Manual(Module):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.a = nn.Linear(8, 1)
            self.b = nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            for opt in self.optimizers():
                opt.zero_grad()
            self.manual_backward(nn.functional.mse_loss(self.a(x) + self.b(x), y))
            for opt in self.optimizers():
                opt.step()

        def on_train_epoch_end(self):
            plateau, halver = self.lr_schedulers()
            assert isinstance(plateau, torch.optim.lr_scheduler.ReduceLROnPlateau) and isinstance(halver, Halver)
            plateau.step(1.0)  # the same value every epoch: no improvement after the first
            halver.halve()

        def configure_optimizers(self):
            opt_a = torch.optim.SGD(self.a.parameters(), lr=0.05)
            opt_b = torch.optim.SGD(self.b.parameters(), lr=0.1)
            # no monitor: in manual optimisation the user steps ReduceLROnPlateau with whatever value they like
            return [opt_a, opt_b], [torch.optim.lr_scheduler.ReduceLROnPlateau(opt_a, factor=0.5, patience=0),
                                    Halver(opt_b)]

    trainer = Trainer(**quiet(max_epochs=3, limit_train_batches=2))
    trainer.fit(Manual(), datamodule=RegressionData())
    # plateau: epoch 1 sets best=1.0, epochs 2 and 3 are bad (patience 0) -> halved twice; Halver: 3 times
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05 * 0.25)
    assert trainer.optimizers[1].param_groups[0]["lr"] == pytest.approx(0.1 / 8)
