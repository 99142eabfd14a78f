"""Module: hyperparameters, logging rules, utilities, and a LightningModule ported by changing imports."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from tests.helpers import Regressor, loader, quiet
from torchfleet import Module, Trainer
from torchfleet.errors import ConfigurationError


def test_save_hyperparameters_records_init_args():
    model = Regressor(hidden=7, lr=0.3)
    assert model.hparams == {"d_in": 8, "hidden": 7, "lr": 0.3, "dropout": 0.0, "scheduler": None}
    assert model.hparams.hidden == 7


def test_save_hyperparameters_subset_ignore_and_subclass():
    class Base(Module):
        def __init__(self, a=1, b=2, net=None):
            super().__init__()
            self.save_hyperparameters(ignore="b")

    class Child(Base):
        def __init__(self, a=1, b=2, c=3, **kwargs):
            super().__init__(a=a, b=b, net=nn.Linear(1, 1))

    assert dict(Base(a=5, net=nn.Linear(1, 1)).hparams) == {"a": 5}  # modules are not hyperparameters
    child = Child(a=4, c=9, extra="x")
    assert child.hparams["c"] == 9 and child.hparams["extra"] == "x" and "b" not in child.hparams

    class Only(Module):
        def __init__(self, x=1, y=2):
            super().__init__()
            self.save_hyperparameters("y")

    assert dict(Only().hparams) == {"y": 2}

    class Wrong(Module):
        def __init__(self, x=1):
            super().__init__()
            self.save_hyperparameters("z")

    with pytest.raises(ConfigurationError, match="z"):
        Wrong()


def test_missing_hparam_attribute_error_lists_saved():
    with pytest.raises(AttributeError, match="hidden"):
        Regressor().hparams.nope


def test_log_outside_trainer_is_a_no_op_and_trainer_access_explains():
    model = Regressor()
    model.log("x", 1.0)  # e.g. in a unit test of the step: nothing to record, no error
    with pytest.raises(RuntimeError, match="Regressor is not attached to a `Trainer`: self.trainer exists inside"):
        model.trainer


def test_the_trainer_reaches_the_modules_inside_a_module():
    from tests.helpers import RegressionData

    seen = []

    class Ensemble(Regressor):
        def __init__(self):
            super().__init__()
            self.inner = Regressor()

        def training_step(self, batch, batch_idx):
            seen.append(self.inner.trainer)
            return super().training_step(batch, batch_idx)

    ensemble = Ensemble()
    trainer = Trainer(max_steps=1, **quiet())
    trainer.fit(ensemble, datamodule=RegressionData())
    assert seen == [trainer]  # the inner Module was given the Trainer with the outer one (as Lightning)
    ensemble.trainer = None
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):
        ensemble.inner.trainer


def test_sync_dist_with_rank_zero_only_is_refused():
    class Both(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("x", loss, sync_dist=True, rank_zero_only=True)
            return loss

    with pytest.raises(ConfigurationError, match="rank_zero_only"):
        Trainer(max_epochs=1, **quiet()).fit(Both(), loader())


def test_missing_training_step_and_optimizers_are_explained():
    class NoStep(Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(8, 1)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(ConfigurationError, match="training_step"):
        Trainer(max_epochs=1, **quiet()).fit(NoStep(), loader())

    class NoOpt(Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            return self.l(batch[0]).sum()

    with pytest.raises(ConfigurationError, match="configure_optimizers"):
        Trainer(max_epochs=1, **quiet()).fit(NoOpt(), loader())


def test_freeze_unfreeze_device_dtype():
    model = Regressor()
    model.freeze()
    assert not any(p.requires_grad for p in model.parameters()) and not model.training
    model.unfreeze()
    assert all(p.requires_grad for p in model.parameters()) and model.training
    assert model.device == torch.device("cpu") and model.dtype == torch.float32


def test_all_gather_on_one_device_adds_a_dim():
    model = Regressor()
    out = model.all_gather({"a": torch.ones(3), "b": [torch.zeros(2, 2)]})
    assert out["a"].shape == (1, 3) and out["b"][0].shape == (1, 2, 2)


LIGHTNING_SOURCE = textwrap.dedent('''
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint, EarlyStopping, LearningRateMonitor


    class LitClassifier(pl.LightningModule):
        def __init__(self, hidden: int = 32, lr: float = 0.05):
            super().__init__()
            self.save_hyperparameters()
            self.model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 3))

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            self.log("val_loss", nn.functional.cross_entropy(logits, y), prog_bar=True)
            self.log("val_acc", (logits.argmax(-1) == y).float().mean())

        def on_train_epoch_end(self):
            self.log("lr", self.optimizers().param_groups[0]["lr"])

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=1)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "val_loss"}}


    class LitData(pl.LightningDataModule):
        def __init__(self, batch_size: int = 16):
            super().__init__()
            self.batch_size = batch_size

        def setup(self, stage):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(256, 4, generator=g)
            y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
            self.train_set = TensorDataset(x[:192], y[:192])
            self.val_set = TensorDataset(x[192:], y[192:])

        def train_dataloader(self):
            return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

        def val_dataloader(self):
            return DataLoader(self.val_set, batch_size=self.batch_size)


    def main(root):
        pl.seed_everything(0)
        trainer = pl.Trainer(
            max_epochs=8, default_root_dir=root, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[ModelCheckpoint(monitor="val_loss", save_top_k=2), EarlyStopping("val_loss", patience=5),
                       LearningRateMonitor()],
        )
        model = LitClassifier()
        trainer.fit(model, datamodule=LitData())
        return trainer, model
''')


def port(source: str) -> str:
    """What a user changes: the imports and the base classes' names."""
    return (
        source.replace("import lightning.pytorch as pl", "import torchfleet as pl")
        .replace("from lightning.pytorch.callbacks import", "from torchfleet.callbacks import")
        .replace("pl.LightningModule", "pl.Module")
        .replace("pl.LightningDataModule", "pl.DataModule")
    )


def test_lightning_module_ports_by_changing_imports(tmp_path):
    ported = port(LIGHTNING_SOURCE)
    changed = [a for a, b in zip(LIGHTNING_SOURCE.splitlines(), ported.splitlines()) if a != b]
    assert len(changed) == 4  # two import lines, two base classes
    namespace: dict = {}
    exec(compile(ported, "lit_classifier.py", "exec"), namespace)
    trainer, model = namespace["main"](str(tmp_path))
    assert trainer.callback_metrics["val_acc"] > 0.6  # chance is about 0.33
    assert trainer.checkpoint_callback.best_model_path
    reloaded = namespace["LitClassifier"].load_from_checkpoint(trainer.checkpoint_callback.best_model_path)
    assert reloaded.hparams.hidden == 32
    assert (tmp_path / "logs").exists()


def test_ranks_are_the_trainers_own():
    # a stand-in trainer (Lightning's tests use Mock(global_rank=...)) answers for the module, as in Lightning
    import types

    model = Regressor()
    assert (model.global_rank, model.local_rank) == (0, 0)
    model.trainer = types.SimpleNamespace(global_rank=3, local_rank=1, strategy=None)
    assert (model.global_rank, model.local_rank) == (3, 1)
