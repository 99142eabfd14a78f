"""fit(ckpt_path=...) resumes exactly: an interrupted and resumed run ends bitwise equal to an uninterrupted one."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import RegressionData, Regressor, quiet
from torchfleet import Trainer
from torchfleet.callbacks import Callback
from torchfleet.errors import CheckpointError


class Interrupt(Exception):
    pass


class SaveThenCrash(Callback):
    """Saves a checkpoint at global step ``save_at`` (or at an epoch end), then crashes at ``crash_at``."""

    def __init__(self, path, save_at=None, save_epoch_end=None, crash_at=None):
        self.path, self.save_at, self.save_epoch_end, self.crash_at = path, save_at, save_epoch_end, crash_at

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.save_at is not None and trainer.global_step == self.save_at:
            trainer.save_checkpoint(self.path)
        if self.crash_at is not None and trainer.global_step == self.crash_at:
            raise Interrupt()

    def on_train_epoch_end(self, trainer, module):
        if self.save_epoch_end is not None and trainer.current_epoch == self.save_epoch_end:
            trainer.save_checkpoint(self.path)


def _run(callbacks=(), ckpt_path=None, seed=0, **kw):
    torch.manual_seed(seed)
    model = Regressor(dropout=0.2, scheduler="step")
    trainer = Trainer(max_epochs=3, callbacks=list(callbacks), **quiet(**kw))
    trainer.fit(model, datamodule=RegressionData(shuffle=True), ckpt_path=ckpt_path)
    return model, trainer


def _assert_same(a, b):
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize(
    "where",
    [
        {"save_at": 13},  # mid-epoch (epoch 1, batch 5 of 8)
        {"save_epoch_end": 0},  # at the end of the first epoch
        {"save_at": 4, "val_check_interval": 0.5},  # on a batch after which validation is due
    ],
    ids=["mid-epoch", "epoch-end", "validation-due"],
)
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, where):
    extra = {k: v for k, v in where.items() if k == "val_check_interval"}
    reference, ref_trainer = _run(**extra)

    path = tmp_path / "mid.ckpt"
    save = {k: v for k, v in where.items() if k != "val_check_interval"}
    with pytest.raises(Interrupt):
        _run([SaveThenCrash(path, crash_at=20, **save)], **extra)
    assert path.exists()

    # a different seed and a fresh model: everything must come from the checkpoint
    resumed, trainer = _run(ckpt_path=path, seed=123, **extra)
    _assert_same(resumed, reference)
    assert trainer.global_step == ref_trainer.global_step == 24
    assert trainer.optimizers[0].param_groups[0]["lr"] == ref_trainer.optimizers[0].param_groups[0]["lr"]
    for s1, s2 in zip(trainer.optimizers[0].state.values(), ref_trainer.optimizers[0].state.values()):
        assert torch.equal(s1["momentum_buffer"], s2["momentum_buffer"])


def test_resume_last_finds_newest_checkpoint(tmp_path):
    from torchfleet.callbacks import ModelCheckpoint

    torch.manual_seed(0)
    trainer = Trainer(max_epochs=2, default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                      logger=False, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)])
    trainer.fit(Regressor(), datamodule=RegressionData())
    trainer2 = Trainer(max_epochs=3, default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                       logger=False, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)])
    trainer2.fit(Regressor(), datamodule=RegressionData(), ckpt_path="last")
    assert trainer2.global_step == 24  # resumed at step 16, one more epoch of 8


def test_missing_checkpoint_path_is_clear(tmp_path):
    (tmp_path / "epoch=1.ckpt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="does not exist.*epoch=1.ckpt"):
        Trainer(**quiet()).fit(Regressor(), datamodule=RegressionData(), ckpt_path=tmp_path / "nope.ckpt")


def test_not_a_torchfleet_checkpoint(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(Regressor().state_dict(), path)
    with pytest.raises(CheckpointError, match="not a torchfleet checkpoint"):
        Trainer(**quiet()).fit(Regressor(), datamodule=RegressionData(), ckpt_path=path)
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"this is not a pickle")
    with pytest.raises(CheckpointError):
        Trainer(**quiet()).fit(Regressor(), datamodule=RegressionData(), ckpt_path=garbage)


def test_checkpoint_of_other_architecture_names_keys(tmp_path):
    path = tmp_path / "a.ckpt"
    SaveThenCrash(path)
    trainer = Trainer(max_epochs=1, callbacks=[SaveThenCrash(path, save_at=2)], **quiet())
    trainer.fit(Regressor(hidden=16), datamodule=RegressionData())
    with pytest.raises(CheckpointError, match=r"net.0.weight.*\(16, 8\).*\(32, 8\)"):
        Trainer(**quiet()).fit(Regressor(hidden=32), datamodule=RegressionData(), ckpt_path=path)


def test_weights_only_checkpoint_cannot_resume_but_loads(tmp_path):
    class SaveWeights(Callback):
        def on_train_end(self, trainer, module):
            trainer.save_checkpoint(tmp_path / "w.ckpt", weights_only=True)

    model = Regressor(hidden=12)
    Trainer(max_epochs=1, callbacks=[SaveWeights()], **quiet()).fit(model, datamodule=RegressionData())
    with pytest.raises(CheckpointError, match="weights only"):
        Trainer(**quiet()).fit(Regressor(hidden=12), datamodule=RegressionData(), ckpt_path=tmp_path / "w.ckpt")
    loaded = Regressor.load_from_checkpoint(str(tmp_path / "w.ckpt"))
    assert loaded.hparams.hidden == 12
    _assert_same(loaded, model)


def test_test_with_best_checkpoint(tmp_path):
    from torchfleet.callbacks import ModelCheckpoint

    trainer = Trainer(max_epochs=3, default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                      logger=False, num_sanity_val_steps=0, callbacks=[ModelCheckpoint(monitor="val_loss")])
    with pytest.raises(CheckpointError, match="best"):
        trainer.test(Regressor(), datamodule=RegressionData(), ckpt_path="best")
    model = Regressor()
    trainer.fit(model, datamodule=RegressionData())
    best = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)
    out = trainer.test(model, datamodule=RegressionData(), ckpt_path="best")
    assert set(out[0]) == {"test_loss"}
    for name, value in model.state_dict().items():
        assert torch.equal(value, best["state_dict"][name])
