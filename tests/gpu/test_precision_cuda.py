"""Every precision on CUDA, through the Trainer and through Fleet, against the same loop written by hand."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf
from tests.gpu.conftest import needs_cuda

pytestmark = needs_cuda(1, "compares training on a CUDA device with a hand-written CUDA loop")

PRECISIONS = ["32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"]
_TRUE_DTYPE = {"64-true": torch.float64, "16-true": torch.float16, "bf16-true": torch.bfloat16}
_AUTOCAST = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}
#: bitwise where the arithmetic is the same kernels in the same order; low precisions within a few ulps
_ATOL = {"32-true": 0.0, "64-true": 0.0, "16-mixed": 1e-5, "bf16-mixed": 1e-5, "16-true": 2e-3, "bf16-true": 1.6e-2}
EPOCHS, BATCH = 2, 8


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    return TensorDataset(x, torch.sin(x).sum(1, keepdim=True))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def _optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def hand_written(precision: str) -> tuple[dict, float | None]:
    """The loop a user would write for ``precision`` on cuda:0; returns the weights and the final loss scale."""
    device = torch.device("cuda", 0)
    dtype = _TRUE_DTYPE.get(precision)
    model = _net()
    if dtype is not None:
        model = model.to(dtype)
    model = model.to(device)
    opt = _optimizer(model.parameters())
    scaler = torch.amp.GradScaler("cuda") if precision == "16-mixed" else None
    for _ in range(EPOCHS):
        for x, y in DataLoader(_data(), batch_size=BATCH):
            x, y = x.to(device), y.to(device)
            if dtype is not None:
                x, y = x.to(dtype), y.to(dtype)
            ctx = torch.autocast("cuda", dtype=_AUTOCAST[precision]) if precision in _AUTOCAST else contextlib.nullcontext()
            with ctx:
                loss = nn.functional.mse_loss(model(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            opt.zero_grad(set_to_none=True)
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}, scaler.get_scale() if scaler else None


class Net(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _net()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return _optimizer(self.parameters())


def _assert_same(got: dict, want: dict, atol: float) -> None:
    assert got.keys() == want.keys()
    for k in want:
        g, w = got[k].cpu(), want[k]
        assert g.dtype == w.dtype, k
        if atol == 0.0:
            assert torch.equal(g, w), f"{k}: max |diff| {(g.double() - w.double()).abs().max().item():.3g}"
        else:
            torch.testing.assert_close(g, w, atol=atol, rtol=0)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_trainer_on_cuda_equals_the_hand_written_loop(precision):
    want, want_scale = hand_written(precision)
    model = Net()
    trainer = tf.Trainer(accelerator="cuda", devices=1, precision=precision, max_epochs=EPOCHS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    assert trainer.strategy.root_device.type == "cuda"
    trainer.fit(model, DataLoader(_data(), batch_size=BATCH))
    got = {k.removeprefix("net."): v for k, v in model.state_dict().items()}
    _assert_same(got, want, _ATOL[precision])
    if want_scale is not None:
        assert trainer.strategy.precision.scaler.get_scale() == want_scale


@pytest.mark.parametrize("precision", PRECISIONS)
def test_fleet_on_cuda_equals_the_hand_written_loop(precision):
    want, want_scale = hand_written(precision)
    fleet = tf.Fleet(accelerator="cuda", devices=1, precision=precision)
    model = _net()
    model, opt = fleet.setup(model, _optimizer(model.parameters()))
    loader = fleet.setup_dataloaders(DataLoader(_data(), batch_size=BATCH))
    for _ in range(EPOCHS):
        for x, y in loader:
            assert x.is_cuda
            loss = nn.functional.mse_loss(model(x), y)
            fleet.backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
    _assert_same(model.state_dict(), want, _ATOL[precision])
    if want_scale is not None:
        assert fleet.strategy.precision.scaler.get_scale() == want_scale
