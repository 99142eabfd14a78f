"""Every precision mode available on CPU trains; aliases normalise; the scaler skips inf steps."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.helpers import Regressor, loader, make_data, quiet
from torchfleet import Trainer
from torchfleet.errors import ConfigurationError
from torchfleet.precision import MixedPrecision, Precision, normalize_precision, precision_for


@pytest.mark.parametrize(
    "given, canonical",
    [(16, "16-mixed"), ("16", "16-mixed"), (32, "32-true"), ("32", "32-true"), (64, "64-true"), ("64", "64-true"),
     ("bf16", "bf16-mixed"), ("bf16-mixed", "bf16-mixed"), ("16-true", "16-true"), ("bf16-true", "bf16-true")],
)
def test_aliases(given, canonical):
    assert normalize_precision(given) == canonical


@pytest.mark.parametrize("given, near", [("bf16mixed", "bf16-mixed"), ("fp16", "16-mixed"), ("32true", "32-true"),
                                         ("half", "16-mixed")])
def test_unknown_precision_suggests(given, near):
    with pytest.raises(ConfigurationError, match=f"Did you mean '{near}'"):
        normalize_precision(given)


@pytest.mark.parametrize("bad", [True, 8, None, 16.0])
def test_non_precision_values(bad):
    with pytest.raises(ConfigurationError, match="Accepted values"):
        normalize_precision(bad)


@pytest.mark.parametrize(
    "precision, param_dtype",
    [("64-true", torch.float64), ("32-true", torch.float32), ("bf16-mixed", torch.float32),
     ("bf16-true", torch.bfloat16), ("16-mixed", torch.float32), ("16-true", torch.float16)],
)
def test_each_precision_trains_on_cpu(precision, param_dtype):
    torch.manual_seed(0)
    model = Regressor(lr=0.01)
    x, y = make_data(64).tensors
    before = nn.functional.mse_loss(model(x), y).item()
    dtypes = []

    class Spy(Regressor):
        def forward(self, x):
            out = super().forward(x)
            dtypes.append(out.dtype)
            return out

    spy = Spy(lr=0.01)
    spy.load_state_dict(model.state_dict())
    trainer = Trainer(max_epochs=3, precision=precision, **quiet())
    trainer.fit(spy, loader())
    assert trainer.precision == precision
    assert all(p.dtype == param_dtype for p in spy.parameters())
    expected_compute = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision, param_dtype)
    assert dtypes[0] == expected_compute
    after = nn.functional.mse_loss(spy.float()(x), y).item()
    assert after < before


def test_mixed_precision_forward_really_autocasts():
    p = precision_for("bf16-mixed", "cpu")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with p.forward_context():
        assert (a @ b).dtype == torch.bfloat16
    assert (a @ b).dtype == torch.float32


def test_true_precision_casts_nested_inputs():
    p = precision_for("64-true", "cpu")
    batch = {"x": torch.ones(2), "ids": torch.ones(2, dtype=torch.long), "more": [torch.zeros(1), "tag"]}
    out = p.convert_input(batch)
    assert out["x"].dtype == torch.float64 and out["ids"].dtype == torch.long
    assert out["more"][0].dtype == torch.float64 and out["more"][1] == "tag"
    assert Precision().convert_input(batch) is batch


def test_scaler_skips_step_with_inf_gradients_and_lowers_scale():
    p = precision_for("16-mixed", "cpu")
    assert isinstance(p, MixedPrecision) and p.scaler is not None
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = copy.deepcopy(model.state_dict())
    with p.forward_context():
        loss = model(torch.ones(1, 2)).sum() * float("inf")
    p.backward(loss, model)
    scale = p.scaler.get_scale()
    p.optimizer_step(opt)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert p.scaler.get_scale() < scale
    state = p.state_dict()
    fresh = precision_for("16-mixed", "cpu")
    fresh.load_state_dict(state)
    assert fresh.scaler.get_scale() == p.scaler.get_scale()


def test_scaler_unscales_once_before_clipping():
    p = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=1024.0))
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with p.forward_context():
        loss = model(torch.ones(1, 2)).sum()
    p.backward(loss, model)
    p.unscale_gradients(opt)
    grad = model.weight.grad.clone()
    p.unscale_gradients(opt)  # a second call in the same step changes nothing
    assert torch.equal(grad, model.weight.grad)
    torch.testing.assert_close(grad, torch.ones(1, 2))
    p.optimizer_step(opt)


def test_precision_object_is_used_as_is():
    p = MixedPrecision("bf16-mixed", "cpu")
    assert precision_for(p, "cpu") is p


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: checks 16-mixed uses a CUDA GradScaler")
def test_cuda_16_mixed_uses_cuda_scaler():
    p = precision_for("16-mixed", "cuda")
    assert p.scaler is not None and p.device_type == "cuda"
