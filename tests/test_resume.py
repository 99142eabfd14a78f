"""fit(ckpt_path=...) resumes exactly: an interrupted and resumed run ends bitwise equal to an uninterrupted one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import RegressionData, Regressor, quiet
from torchfleet import Trainer
from torchfleet.callbacks import Callback, EarlyStopping, LearningRateMonitor, ModelCheckpoint
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
    trainer = Trainer(max_epochs=3, callbacks=list(callbacks), **quiet(accelerator="cpu", **kw))
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


# ---------------------------------------------------------------------------- a run that returned, then resumed
class Plateau(Regressor):
    """Logs a validation score that never improves, so EarlyStopping stops after ``patience`` checks."""

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.log("plateau", torch.tensor(1.0))


class NumpyNoise(Regressor):
    """Scales its loss by a NumPy draw, so a resumed run matches only if NumPy's RNG state is restored."""

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * float(1.0 + 0.1 * np.random.rand())


def _fit_cpu(model_cls=Regressor, ckpt_path=None, seed=0, scheduler="step", callbacks=(), **kw):
    torch.manual_seed(seed)
    np.random.seed(seed)
    model = model_cls(dropout=0.2, scheduler=scheduler)
    trainer = Trainer(callbacks=list(callbacks), **quiet(accelerator="cpu", **kw))
    trainer.fit(model, datamodule=RegressionData(shuffle=True), ckpt_path=ckpt_path)
    return model, trainer


def _assert_same_run(model, trainer, ref_model, ref_trainer):
    _assert_same(model, ref_model)
    assert (trainer.global_step, trainer.current_epoch) == (ref_trainer.global_step, ref_trainer.current_epoch)
    assert trainer.optimizers[0].param_groups[0]["lr"] == ref_trainer.optimizers[0].param_groups[0]["lr"]
    for s1, s2 in zip(trainer.optimizers[0].state.values(), ref_trainer.optimizers[0].state.values()):
        assert torch.equal(s1["momentum_buffer"], s2["momentum_buffer"])


@pytest.mark.parametrize("scheduler", ["step", "epoch"])
@pytest.mark.parametrize("stop_at", [10, 8, 3], ids=["mid-epoch", "epoch-boundary", "first-epoch"])
def test_resume_after_max_steps_returned(tmp_path, stop_at, scheduler):
    reference, ref_trainer = _fit_cpu(scheduler=scheduler, max_steps=20)
    assert (ref_trainer.global_step, ref_trainer.current_epoch) == (20, 3)  # 8 + 8 + 4 batches

    _, first = _fit_cpu(scheduler=scheduler, max_steps=stop_at)
    first.save_checkpoint(tmp_path / "stop.ckpt")
    fit = torch.load(tmp_path / "stop.ckpt", weights_only=True)["loops"]["fit"]
    # the checkpoint says where the run stopped: in which epoch, after how many of its 8 batches
    assert (fit["epoch"], fit["batches_done"]) == (stop_at // 8 - (stop_at % 8 == 0), stop_at % 8 or 8)
    assert fit["stopped_mid_epoch"] == (stop_at % 8 != 0)
    if scheduler == "epoch":
        # StepLR(step_size=1, gamma=0.5) steps once per whole epoch, not at a stop inside one
        assert first.optimizers[0].param_groups[0]["lr"] == 0.05 * 0.5 ** (stop_at // 8)

    resumed, trainer = _fit_cpu(scheduler=scheduler, ckpt_path=tmp_path / "stop.ckpt", seed=123, max_steps=20)
    _assert_same_run(resumed, trainer, reference, ref_trainer)


def test_resume_that_has_nothing_left_to_run_keeps_the_position(tmp_path):
    reference, ref_trainer = _fit_cpu(max_steps=20)
    _, first = _fit_cpu(max_steps=10)
    first.save_checkpoint(tmp_path / "a.ckpt")
    _, again = _fit_cpu(ckpt_path=tmp_path / "a.ckpt", seed=7, max_steps=10)  # runs no step
    assert (again.global_step, again.current_epoch) == (first.global_step, first.current_epoch)
    torch.manual_seed(99)  # the RNG of this process must not leak into the re-saved checkpoint
    again.save_checkpoint(tmp_path / "b.ckpt")
    resumed, trainer = _fit_cpu(ckpt_path=tmp_path / "b.ckpt", seed=123, max_steps=20)
    _assert_same_run(resumed, trainer, reference, ref_trainer)


def test_resume_after_max_time_returned(tmp_path, monkeypatch):
    from torchfleet.trainer.callbacks import timer

    run = {}
    # the budget's clock reads the step count as seconds: a stop after exactly 10 steps, without real time
    monkeypatch.setattr(timer, "_now", lambda: float(run["trainer"].global_step))

    def fit(ckpt_path=None, seed=0, **kw):
        torch.manual_seed(seed)
        model = Regressor(dropout=0.2, scheduler="step")
        run["trainer"] = trainer = Trainer(**quiet(accelerator="cpu", **kw))
        trainer.fit(model, datamodule=RegressionData(shuffle=True), ckpt_path=ckpt_path)
        return model, trainer

    reference, ref_trainer = fit(max_steps=20)
    _, first = fit(max_time={"seconds": 10})
    assert first.global_step == 10 and first.current_epoch == 2  # as max_steps=10 ends it
    first.save_checkpoint(tmp_path / "time.ckpt")
    resumed, trainer = fit(ckpt_path=tmp_path / "time.ckpt", seed=123, max_steps=20)
    _assert_same_run(resumed, trainer, reference, ref_trainer)

    # the time spent is in the checkpoint: a budget of 15 s leaves 5 for the resumed run
    ref15, ref15_trainer = fit(max_steps=15)
    resumed, trainer = fit(ckpt_path=tmp_path / "time.ckpt", seed=123, max_time="00:00:00:15")
    _assert_same_run(resumed, trainer, ref15, ref15_trainer)


@pytest.mark.parametrize("where", ["epoch-end", "mid-epoch"])
def test_resume_after_early_stopping_returned(tmp_path, where):
    kw = {"val_check_interval": 0.5} if where == "mid-epoch" else {}
    # checks at each validation: the first improves, then `patience` do not
    patience = 1 if where == "epoch-end" else 2
    stop_step = 16 if where == "epoch-end" else 12

    def stopper():
        return EarlyStopping(monitor="plateau", patience=patience)

    _, first = _fit_cpu(Plateau, callbacks=[stopper()], max_epochs=10, **kw)
    assert first.global_step == stop_step
    # parity: a stop in epoch k leaves current_epoch k + 1, as when max_epochs or max_steps ends the run there
    _, same_stop = _fit_cpu(Plateau, max_steps=stop_step, **kw)
    assert first.current_epoch == same_stop.current_epoch == 2
    first.save_checkpoint(tmp_path / "early.ckpt")

    reference, ref_trainer = _fit_cpu(Plateau, max_steps=28, **kw)
    resumed, trainer = _fit_cpu(Plateau, ckpt_path=tmp_path / "early.ckpt", seed=123, max_steps=28, **kw)
    _assert_same_run(resumed, trainer, reference, ref_trainer)


class InterruptAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise KeyboardInterrupt


class InterruptedStep(Regressor):
    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 10:  # before the step draws anything (dropout)
            raise KeyboardInterrupt
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("source", ["callback", "training_step"])
def test_resume_after_keyboard_interrupt(tmp_path, source):
    reference, ref_trainer = _fit_cpu(max_steps=20)
    torch.manual_seed(0)
    model = InterruptedStep(dropout=0.2, scheduler="step") if source == "training_step" else Regressor(
        dropout=0.2, scheduler="step")
    seen = []

    class Seen(Callback):
        def on_exception(self, trainer, module, exc):
            seen.append(type(exc))

    callbacks = [Seen()] + ([InterruptAt(10)] if source == "callback" else [])
    first = Trainer(max_steps=20, callbacks=callbacks, **quiet(accelerator="cpu"))
    with pytest.raises(SystemExit) as info:  # as Lightning: exit status 1, after the callbacks' on_exception
        first.fit(model, datamodule=RegressionData(shuffle=True))
    assert isinstance(info.value.__cause__, KeyboardInterrupt) and info.value.code == 1
    assert seen == [KeyboardInterrupt] and first.global_step == 10
    first.save_checkpoint(tmp_path / "ctrl-c.ckpt")
    resumed, trainer = _fit_cpu(ckpt_path=tmp_path / "ctrl-c.ckpt", seed=123, max_steps=20)
    _assert_same_run(resumed, trainer, reference, ref_trainer)


# ---------------------------------------------------------------------------- weights_only loading
def test_checkpoints_load_with_weights_only(tmp_path):
    callbacks = [ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_last=True),
                 EarlyStopping(monitor="val_loss", patience=5), LearningRateMonitor()]
    _, trainer = _fit_cpu(NumpyNoise, scheduler="epoch", callbacks=callbacks, max_epochs=2, max_time={"hours": 1},
                          enable_checkpointing=True, default_root_dir=tmp_path, logger=True)  # the monitor logs
    trainer.save_checkpoint(tmp_path / "all.ckpt")
    for path in [tmp_path / "all.ckpt", tmp_path / "ck" / "last.ckpt", trainer.checkpoint_callback.best_model_path]:
        ckpt = torch.load(path, weights_only=True)
        assert {"optimizer_states", "lr_schedulers", "callbacks", "loops", "rng"} <= set(ckpt)
    # NumPy's state, stored as plain values, still puts NumPy's generator back
    from torchfleet.seed import restore_rng

    ckpt = torch.load(tmp_path / "all.ckpt", weights_only=True)
    restore_rng(ckpt["rng"])
    first = np.random.rand(3)
    restore_rng(ckpt["rng"])
    assert np.array_equal(first, np.random.rand(3))


def test_bundled_example_checkpoint_loads_with_weights_only(tmp_path):
    from torchfleet.examples.addition import AdditionData, AdditionTransformer

    trainer = Trainer(max_steps=2, **quiet(accelerator="cpu"))
    trainer.fit(AdditionTransformer(), datamodule=AdditionData(num_train=256, num_val=32, batch_size=64))
    trainer.save_checkpoint(tmp_path / "example.ckpt")
    ckpt = torch.load(tmp_path / "example.ckpt", weights_only=True)
    assert ckpt["hyper_parameters"]["digits"] == 3


def _as_old_format(rng):
    # checkpoints before the plain-values format held NumPy's state as np.random.get_state() returns it
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    return {**rng, "numpy": (kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)}


def test_old_checkpoint_with_numpy_array_state_still_resumes(tmp_path):
    reference, ref_trainer = _fit_cpu(NumpyNoise, max_steps=20)
    _, first = _fit_cpu(NumpyNoise, max_steps=10)
    first.save_checkpoint(tmp_path / "new.ckpt")
    ckpt = torch.load(tmp_path / "new.ckpt", weights_only=True)
    ckpt["rng"] = _as_old_format(ckpt["rng"])
    fit = ckpt["loops"]["fit"]
    for key in ("epoch_start_rng", "resume_rng"):
        fit[key] = _as_old_format(fit[key])
    torch.save(ckpt, tmp_path / "old.ckpt")
    with pytest.raises(Exception, match="weights_only|Unsupported global"):
        torch.load(tmp_path / "old.ckpt", weights_only=True)  # the old form, as the issue reports it
    resumed, trainer = _fit_cpu(NumpyNoise, ckpt_path=tmp_path / "old.ckpt", seed=123, max_steps=20)
    _assert_same_run(resumed, trainer, reference, ref_trainer)


def test_cuda_rng_states_of_a_gpu_checkpoint_are_left_alone_in_a_run_without_cuda():
    # a checkpoint written on a machine with 8 GPUs, resumed by a CPU run (here, or on a GPU machine)
    from torchfleet.seed import capture_rng, restore_rng

    if torch.cuda.is_initialized():
        pytest.skip("an earlier test used CUDA in this process; tests/gpu checks a GPU checkpoint resumed on the CPU")
    state = capture_rng()
    assert "cuda" not in state  # this process never used CUDA
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    restore_rng({**capture_rng(), "cuda": [torch.zeros(16, dtype=torch.uint8)] * 8})
    assert torch.equal(torch.rand(3), expected)
    assert not torch.cuda.is_initialized()


def test_epoch_end_checkpoint_holds_the_scheduler_after_its_step(tmp_path):
    from torchfleet.callbacks import ModelCheckpoint

    # validation runs at each epoch end and ModelCheckpoint saves after it (on_validation_end): the epoch's
    # StepLR(step_size=1, gamma=0.5) step must already be in that checkpoint
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, filename="{epoch}")
    torch.manual_seed(0)
    Trainer(**quiet(max_epochs=2, enable_checkpointing=True, callbacks=[ckpt])).fit(
        Regressor(scheduler="epoch"), datamodule=RegressionData(shuffle=False))
    first = torch.load(tmp_path / "epoch=0.ckpt", weights_only=True)
    assert first["lr_schedulers"][0]["last_epoch"] == 1 and first["lr_schedulers"][0]["_step_count"] == 2
    assert first["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(0.05 * 0.5)

    # resuming from it: epochs 1 and 2 run at 0.025 and 0.0125, as in an uninterrupted 3-epoch run
    lrs = {}

    class RecordLR(Regressor):
        def training_step(self, batch, batch_idx):
            lrs.setdefault(self.current_epoch, set()).add(self.trainer.optimizers[0].param_groups[0]["lr"])
            return super().training_step(batch, batch_idx)

    torch.manual_seed(0)
    whole = RecordLR(scheduler="epoch")
    Trainer(**quiet(max_epochs=3)).fit(whole, datamodule=RegressionData(shuffle=False))
    assert lrs == {0: {0.05}, 1: {0.05 * 0.5}, 2: {0.05 * 0.25}}  # exact: halving is exact in binary
    lrs.clear()
    resumed = RecordLR(scheduler="epoch")
    trainer = Trainer(**quiet(max_epochs=3))
    trainer.fit(resumed, datamodule=RegressionData(shuffle=False), ckpt_path=str(tmp_path / "epoch=0.ckpt"))
    assert lrs == {1: {0.05 * 0.5}, 2: {0.05 * 0.25}}
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05 * 0.5**3)
    for a, b in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
