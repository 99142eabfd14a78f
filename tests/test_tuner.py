"""Tuner.lr_find and LearningRateFinder: Lightning's rates, losses and suggestion bitwise on one seeded program, and
what the search guarantees checked without Lightning."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.utils.data import DataLoader

from tests.helpers import Regressor, make_data, quiet
from tests.lightning_more_programs import source
from tests.lightning_reference import finish, needs_lightning, run_here, start_in_lightning
from torchfleet import Trainer
from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks.lr_finder import LearningRateFinder
from torchfleet.tuner import Tuner
from torchfleet.tuner.lr_finder import LRFinder


def _both(tmp_path, monkeypatch, program):
    """The program's results under torchfleet (here) and Lightning (started first), both in ``tmp_path``, where
    Lightning writes its tuner's temporary checkpoint."""
    monkeypatch.chdir(tmp_path)
    theirs = start_in_lightning(f"import os\nos.chdir({str(tmp_path)!r})\n" + source("lightning", program))
    ours = json.loads(run_here(source("torchfleet", program)).split("RESULTS ", 1)[1])
    return ours, json.loads(finish(theirs).split("RESULTS ", 1)[1])


@needs_lightning
def test_lr_find_then_fit_gives_lightnings_numbers_bitwise(tmp_path, monkeypatch):
    # the same float32 steps in the same order on the CPU, and the same smoothing in float64: no rounding may differ
    ours, theirs = _both(tmp_path, monkeypatch, "lr_find")
    assert len(ours["lr"]) < 40  # the loss diverged and stopped the search early: that path is compared too
    assert ours == theirs


def _search(model, **kw):
    torch.manual_seed(0)
    data = DataLoader(make_data(64), batch_size=8, shuffle=True)
    trainer = Trainer(max_epochs=10, **quiet())  # as in Lightning, the search also ends with the epochs
    return trainer, data, Tuner(trainer).lr_find(model, data, **kw)


def test_the_search_leaves_weights_and_rng_and_the_next_fit_unchanged():
    torch.manual_seed(1)
    model, twin = Regressor(lr=0.3), Regressor(lr=0.3)
    twin.load_state_dict(model.state_dict())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(5)
    trainer = Trainer(max_epochs=1, **quiet())
    data = DataLoader(make_data(64), batch_size=8, shuffle=True)
    finder = Tuner(trainer).lr_find(model, data, num_training=20, min_lr=1e-4, max_lr=1e-1, update_attr=False)
    for name, value in before.items():
        assert torch.equal(model.state_dict()[name], value)
    # the schedule, computed here: min_lr at the first step, then min_lr * (max_lr / min_lr) ** ((k + 1) / n)
    expected = [1e-4] + [1e-4 * (1e-1 / 1e-4) ** ((k + 1) / 20) for k in range(1, len(finder.results["lr"]))]
    assert finder.results["lr"] == pytest.approx(expected, rel=1e-12)
    trainer.fit(model, data)
    torch.manual_seed(5)  # the same RNG as before the search: the search drew nothing from it
    Trainer(max_epochs=1, **quiet()).fit(twin, data)
    for name, value in twin.state_dict().items():
        assert torch.equal(model.state_dict()[name], value)


def test_the_suggestion_is_where_the_loss_falls_fastest():
    # a constructed curve whose fall (per unit of rate) is steepest at one sampled rate, c: 1 - (1 + tanh) / 2
    lrs = [1e-6 * 10 ** (6 * k / 59) for k in range(60)]
    c, width = lrs[35], 2 * lrs[35]
    finder = LRFinder("exponential", 1e-6, 1.0, 60)
    finder.results = {"lr": lrs, "loss": [1 - (1 + math.tanh((lr - c) / width)) / 2 for lr in lrs]}
    assert finder.suggestion() == c
    # the first 10 points and the last are left out, as are non-finite losses
    finder.results["loss"][35] = float("nan")
    assert finder.suggestion() in (lrs[34], lrs[36])
    finder.results = {"lr": lrs[:12], "loss": [1.0] * 12}
    assert finder.suggestion() is None  # 1 point left: no slope


def test_update_attr_sets_the_models_rate_to_the_suggestion():
    model = Regressor(lr=0.3)
    _, _, finder = _search(model, num_training=30)
    assert finder.suggestion() is not None and model.hparams.lr == finder.suggestion()


def test_bad_requests_are_refused_in_one_paragraph():
    class NoRate(Regressor):
        def __init__(self):
            super().__init__()
            del self.hparams["lr"]

    with pytest.raises(ConfigurationError, match="has neither `lr` nor `learning_rate`"):
        _search(NoRate())
    with pytest.raises(ConfigurationError, match=r"mode='cosine'\) is not valid"):
        _search(Regressor(), mode="cosine")
    with pytest.raises(ConfigurationError, match="method='fit' is the only valid"):
        Tuner(Trainer(**quiet())).lr_find(Regressor(), method="validate")
    trainer = Trainer(max_epochs=1, callbacks=[LearningRateFinder()], **quiet())
    with pytest.raises(ConfigurationError, match=r"Tuner\(trainer\).lr_find"):
        trainer.fit(Regressor(), DataLoader(make_data(16), batch_size=8))


@needs_lightning
def test_scale_batch_size_then_fit_gives_lightnings_numbers_bitwise(tmp_path, monkeypatch):
    # sizes tried, size found, then the fit's weights and the RNG after it: the trials' draws from the RNG included
    ours, theirs = _both(tmp_path, monkeypatch, "batch_size")
    assert ours["power"]["found"] == 32 and ours["binsearch"]["found"] == 45  # 48, less Lightning's 5% margin
    assert ours == theirs


class _Limited(Regressor):
    """Fails as torch does when an allocation fails, for batches over ``limit`` samples."""

    def __init__(self, limit, batch_size=8, message="CUDA out of memory. Tried to allocate 1 GiB"):
        super().__init__()
        self.batch_size, self.limit, self.message, self.sizes = batch_size, limit, message, []

    def training_step(self, batch, batch_idx):
        self.sizes.append(len(batch[0]))
        if len(batch[0]) > self.limit:
            raise RuntimeError(self.message)
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        return DataLoader(make_data(500), batch_size=self.batch_size, shuffle=True)


@pytest.mark.parametrize("mode, limit, expected", [("power", 40, 32), ("power", 100, 64), ("binsearch", 40, 40),
                                                   ("binsearch", 77, 77)])
def test_the_size_found_is_the_largest_that_fits(mode, limit, expected):
    torch.manual_seed(0)
    model = _Limited(limit)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    found = Tuner(Trainer(max_epochs=1, **quiet())).scale_batch_size(model, mode=mode, margin=0.0)
    assert found == expected == model.batch_size
    assert max(s for s in model.sizes if s <= limit) == expected  # it ran at that size
    for name, value in before.items():  # the trials' steps are undone
        assert torch.equal(model.state_dict()[name], value)


def test_an_error_that_is_not_out_of_memory_reaches_the_caller():
    with pytest.raises(RuntimeError, match="shape mismatch"):
        Tuner(Trainer(max_epochs=1, **quiet())).scale_batch_size(_Limited(4, message="shape mismatch"))


def test_batch_size_finder_bad_requests_are_refused_in_one_paragraph():
    from torchfleet.trainer.callbacks.batch_size_finder import BatchSizeFinder, is_oom_error

    assert is_oom_error(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"))
    assert not is_oom_error(RuntimeError("CUDA error: device-side assert triggered"))
    with pytest.raises(ConfigurationError, match=r"mode='linear'\) is not valid"):
        BatchSizeFinder(mode="linear")
    with pytest.raises(ConfigurationError, match=r"margin=1.5\) is not valid"):
        BatchSizeFinder(margin=1.5)
    tuner = Tuner(Trainer(max_epochs=1, **quiet()))
    with pytest.raises(ConfigurationError, match="cannot be used with dataloaders passed directly"):
        tuner.scale_batch_size(_Limited(8), train_dataloaders=DataLoader(make_data(16)))
    with pytest.raises(ConfigurationError, match="Field size not found"):
        tuner.scale_batch_size(_Limited(8), batch_arg_name="size")
    with pytest.raises(ConfigurationError, match=r"Tuner\(trainer\).scale_batch_size"):
        Trainer(max_epochs=1, callbacks=[BatchSizeFinder()], **quiet()).fit(_Limited(8))
