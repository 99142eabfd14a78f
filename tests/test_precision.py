"""Precision: names, each CPU mode training for real, the gradient scaler, input/module conversion."""

from __future__ import annotations

import collections
import copy
import dataclasses
from typing import NamedTuple

import pytest
import torch
from torch import nn

from torchfleet import precision as precision_module
from torchfleet.errors import ConfigurationError
from torchfleet.precision import (
    PRECISIONS,
    DoublePrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
    normalize_precision,
    precision_for,
)

# ------------------------------------------------------------------ names


@pytest.mark.parametrize(
    "given, canonical",
    [(16, "16-mixed"), ("16", "16-mixed"), (32, "32-true"), ("32", "32-true"), (64, "64-true"),
     ("64", "64-true"), ("bf16", "bf16-mixed")] + [(p, p) for p in PRECISIONS],
)
def test_every_alias_normalises(given, canonical):
    assert normalize_precision(given) == canonical


@pytest.mark.parametrize(
    "given, suggestion",
    [("bf16mixed", "bf16-mixed"), ("fp16", "16-mixed"), ("half", "16-mixed"), ("16mixed", "16-mixed"),
     ("bf16_true", "bf16-true"), ("float64", "64-true"), ("FP32", "32-true"), ("64true", "64-true")],
)
def test_bad_names_suggest_the_closest(given, suggestion):
    with pytest.raises(ConfigurationError) as info:
        normalize_precision(given)
    text = str(info.value)
    assert repr(given) in text
    assert f"Did you mean '{suggestion}'" in text
    assert all(repr(p) in text for p in PRECISIONS)  # the accepted values are listed


@pytest.mark.parametrize("bad", [True, False, 8, 16.0, None, torch.float16, "", "128-true"])
def test_values_that_are_not_precisions(bad):
    with pytest.raises(ConfigurationError, match="Accepted values"):
        normalize_precision(bad)


def test_precision_object_passes_through():
    p = MixedPrecision(torch.bfloat16, "cpu")
    assert precision_for(p, "cpu") is p


def test_constructors_take_the_dtype_or_the_name():
    assert MixedPrecision(torch.float16, "cpu").name == "16-mixed"
    assert MixedPrecision("bf16-mixed", "cpu").scaler is None
    assert HalfPrecision(torch.float16).name == "16-true"
    assert HalfPrecision("bf16-true").param_dtype == torch.bfloat16
    assert DoublePrecision().name == "64-true"
    with pytest.raises(ConfigurationError, match="'16-true'"):
        HalfPrecision(torch.float64)
    with pytest.raises(ConfigurationError, match="MixedPrecision"):
        MixedPrecision(torch.float32, "cpu")


# ------------------------------------------------------------------ training in each mode

EXPECTED = {
    # name: (class, param dtype, compute dtype)
    "64-true": (DoublePrecision, torch.float64, torch.float64),
    "32-true": (Precision, torch.float32, torch.float32),
    "16-mixed": (MixedPrecision, torch.float32, torch.float16),
    "bf16-mixed": (MixedPrecision, torch.float32, torch.bfloat16),
    "16-true": (HalfPrecision, torch.float16, torch.float16),
    "bf16-true": (HalfPrecision, torch.bfloat16, torch.bfloat16),
}


class Probe(nn.Module):
    """A tiny regressor that records the dtypes met inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
        self.seen: list[tuple[torch.dtype, torch.dtype]] = []

    def forward(self, x):
        created = torch.zeros(1)  # a tensor made inside forward, with no dtype given
        out = self.net(x)
        self.seen.append((out.dtype, created.dtype))
        return out


def _train(p: Precision, steps: int = 30) -> tuple[Probe, list[float]]:
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    model = p.convert_module(Probe())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        xb, yb = p.convert_input((x, y))
        with p.forward_context():
            loss = nn.functional.mse_loss(model(xb).float(), yb.float())
        p.backward(loss, model)
        p.optimizer_step(opt)
        opt.zero_grad()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("name", PRECISIONS)
def test_each_mode_trains_on_cpu(name):
    cls, param_dtype, compute_dtype = EXPECTED[name]
    p = precision_for(name, "cpu")
    assert type(p) is cls and p.name == name
    assert (p.param_dtype, p.compute_dtype) == (param_dtype, compute_dtype)
    model, losses = _train(p)
    assert losses[-1] < 0.5 * losses[0], losses
    assert {q.dtype for q in model.parameters()} == {param_dtype}
    out_dtype, created_dtype = model.seen[0]
    assert out_dtype == compute_dtype
    # "-true" modes make the default dtype theirs inside forward; mixed modes leave float32
    assert created_dtype == (param_dtype if name.endswith("-true") else torch.float32)
    assert torch.get_default_dtype() == torch.float32  # restored after forward


@pytest.mark.parametrize("name, dtype", [("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)])
def test_mixed_forward_context_really_autocasts(name, dtype):
    p = precision_for(name, "cpu")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with p.forward_context():
        assert (a @ b).dtype == dtype
    assert (a @ b).dtype == torch.float32


def test_true_forward_context_restores_the_default_dtype_on_error_and_nesting():
    p = HalfPrecision(torch.bfloat16)
    ctx = p.forward_context()
    with pytest.raises(RuntimeError, match="boom"), ctx:
        assert torch.get_default_dtype() == torch.bfloat16
        with DoublePrecision().forward_context():
            assert torch.ones(1).dtype == torch.float64
        assert torch.ones(1).dtype == torch.bfloat16
        raise RuntimeError("boom")
    assert torch.get_default_dtype() == torch.float32


def test_full_precision_hot_path_is_identity():
    p = Precision()
    batch = {"x": torch.ones(2)}
    assert p.convert_input(batch) is batch
    assert p.forward_context() is p.forward_context()  # one shared context, nothing built per step
    m = nn.Linear(2, 2)
    assert p.convert_module(m) is m
    assert MixedPrecision("bf16-mixed", "cpu").convert_input(batch) is batch


# ------------------------------------------------------------------ conversion


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    ids: torch.Tensor
    name: str


def test_convert_input_walks_nested_structures():
    p = HalfPrecision(torch.bfloat16)
    counts = collections.defaultdict(int, {"w": torch.ones(1)})
    data = {
        "list": [torch.ones(2), torch.arange(3)],
        "tuple": (torch.ones(1), "tag", 3),
        "pair": Pair(torch.ones(1), torch.zeros(1, dtype=torch.int32)),
        "batch": Batch(torch.ones(2), torch.arange(2), "b0"),
        "counts": counts,
        "ordered": collections.OrderedDict(z=torch.ones(1)),
    }
    out = p.convert_input(data)
    assert out["list"][0].dtype == torch.bfloat16 and out["list"][1].dtype == torch.long
    assert out["tuple"][0].dtype == torch.bfloat16 and out["tuple"][1:] == ("tag", 3)
    assert isinstance(out["pair"], Pair) and out["pair"].a.dtype == torch.bfloat16
    assert out["pair"].b.dtype == torch.int32
    assert isinstance(out["batch"], Batch) and out["batch"].x.dtype == torch.bfloat16
    assert out["batch"].ids.dtype == torch.long and out["batch"].name == "b0"
    assert isinstance(out["counts"], collections.defaultdict) and out["counts"]["w"].dtype == torch.bfloat16
    assert out["counts"]["missing"] == 0  # the default factory survives
    assert isinstance(out["ordered"], collections.OrderedDict) and out["ordered"]["z"].dtype == torch.bfloat16
    assert data["list"][0].dtype == torch.float32  # the input is not modified in place


@pytest.mark.parametrize("name, dtype", [("16-true", torch.float16), ("bf16-true", torch.bfloat16),
                                         ("64-true", torch.float64)])
def test_true_modes_cast_floating_params_and_buffers_only(name, dtype):
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    out = precision_for(name, "cpu").convert_module(model)
    assert {p.dtype for p in out.parameters()} == {dtype}
    assert out[1].running_mean.dtype == dtype
    assert out[1].num_batches_tracked.dtype == torch.long


@pytest.mark.parametrize("name, dtype", [("16-true", torch.float16), ("bf16-true", torch.bfloat16),
                                         ("64-true", torch.float64)])
def test_true_modes_keep_complex_params_and_buffers_complex(name, dtype):
    # only floating-point tensors change dtype (as Lightning's DoublePrecision: module.double()); complex ones keep
    # their dtype and their imaginary part
    model = nn.Linear(2, 2)
    model.phase = nn.Parameter(torch.tensor([1 + 2j, -3j], dtype=torch.complex64))
    model.register_buffer("spectrum", torch.tensor([0.5 - 1j], dtype=torch.complex128))
    out = precision_for(name, "cpu").convert_module(model)
    assert out.weight.dtype == dtype
    assert out.phase.dtype == torch.complex64 and isinstance(out.phase, nn.Parameter)
    assert torch.equal(out.phase.detach(), torch.tensor([1 + 2j, -3j], dtype=torch.complex64))
    assert out.spectrum.dtype == torch.complex128
    assert torch.equal(out.spectrum, torch.tensor([0.5 - 1j], dtype=torch.complex128))


def test_trainer_64_true_trains_a_model_with_a_complex_parameter():
    from torch.utils.data import DataLoader, TensorDataset

    from tests.helpers import quiet
    from torchfleet import Module, Trainer

    class WithComplex(Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 1)
            self.z = nn.Parameter(torch.tensor([1 + 1j], dtype=torch.complex64))
            self.seen = {}

        def training_step(self, batch, batch_idx):
            self.seen = {"lin": self.lin.weight.dtype, "z": self.z.dtype}
            return self.lin(batch[0]).sum() + (self.z.abs() ** 2).sum().double()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = WithComplex()
    Trainer(**quiet(max_steps=1, precision="64-true")).fit(model, DataLoader(TensorDataset(torch.ones(1, 2))))
    assert model.seen == {"lin": torch.float64, "z": torch.complex64}
    # d|z|^2/dz* = 2z for the SGD step: z = (1+1j) - 0.1 * 2 * (1+1j) = 0.8 + 0.8j; the imaginary part survived
    assert torch.allclose(model.z.detach(), torch.tensor([0.8 + 0.8j], dtype=torch.complex64))


def test_mixed_modes_keep_float32_params():
    model = nn.Linear(3, 3)
    out = precision_for("bf16-mixed", "cpu").convert_module(model)
    assert out.weight.dtype == torch.float32


# ------------------------------------------------------------------ gradient scaler (16-mixed)

needs_cpu_scaler = pytest.mark.skipif(
    not precision_module._fp16_on_cpu_works("16-mixed"),
    reason="this torch build cannot autocast to float16 with a GradScaler on the CPU",
)


def _scaled_step(p: MixedPrecision, model: nn.Module, opt, factor: float = 1.0):
    with p.forward_context():
        loss = model(torch.ones(2, 2)).float().sum() * factor
    p.backward(loss, model)
    return p.optimizer_step(opt)


@needs_cpu_scaler
def test_16_mixed_on_cpu_uses_a_cpu_grad_scaler():
    p = precision_for("16-mixed", "cpu")
    assert isinstance(p.scaler, torch.amp.GradScaler) and p.scaler.is_enabled()
    assert p.device_type == "cpu"


@needs_cpu_scaler
def test_inf_gradients_skip_the_step_and_lower_the_scale():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, backoff_factor=0.25)
    p = MixedPrecision("16-mixed", "cpu", scaler=scaler)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = copy.deepcopy(model.state_dict())
    _scaled_step(p, model, opt, factor=float("inf"))  # must not raise
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert p.scaler.get_scale() == 2.0**10 * 0.25
    opt.zero_grad()
    _scaled_step(p, model, opt)  # a finite step right after does update the parameters
    assert not torch.equal(before["weight"], model.weight)


@needs_cpu_scaler
def test_unscale_is_idempotent_within_a_step_and_reset_by_the_step():
    p = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=512.0))
    model = nn.Linear(2, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with p.forward_context():
        loss = model(torch.tensor([[1.0, 2.0]])).float().sum()
    p.backward(loss, model)
    assert torch.equal(model.weight.grad, torch.tensor([[512.0, 1024.0]]))  # scaled by backward
    p.unscale_gradients(opt)
    p.unscale_gradients(opt)  # clipping and the step may both ask; the second call changes nothing
    assert torch.equal(model.weight.grad, torch.tensor([[1.0, 2.0]]))
    w = model.weight.detach().clone()
    p.optimizer_step(opt)
    torch.testing.assert_close(model.weight.detach(), w - 0.1 * torch.tensor([[1.0, 2.0]]))
    # the next step unscales again
    opt.zero_grad()
    with p.forward_context():
        loss = model(torch.tensor([[1.0, 2.0]])).float().sum()
    p.backward(loss, model)
    p.unscale_gradients(opt)
    assert torch.equal(model.weight.grad, torch.tensor([[1.0, 2.0]]))


@needs_cpu_scaler
def test_closure_runs_once_before_the_scaled_step_and_its_result_is_returned():
    # the default initial scale (2**16) overflows float16 gradients on the first step: start lower
    p = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=1024.0))
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    w = model.weight.detach().clone()

    def closure():
        calls.append(1)
        with p.forward_context():
            loss = model(torch.ones(2, 2)).float().sum()
        p.backward(loss, model)
        return loss

    result = p.optimizer_step(opt, closure=closure)
    assert len(calls) == 1
    assert isinstance(result, torch.Tensor) and result.ndim == 0
    assert not torch.equal(w, model.weight)


@needs_cpu_scaler
def test_closure_that_skips_backward_does_not_raise():
    p = precision_for("16-mixed", "cpu")
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = model.weight.detach().clone()
    assert p.optimizer_step(opt, closure=lambda: None) is None
    assert torch.equal(w, model.weight)


@needs_cpu_scaler
def test_scaler_state_round_trips():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=1, growth_factor=2.0)
    p = MixedPrecision("16-mixed", "cpu", scaler=scaler)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        _scaled_step(p, model, opt)
        opt.zero_grad()
    assert p.scaler.get_scale() == 8.0 * 2.0**3  # grew once per finite step
    state = p.state_dict()
    fresh = precision_for("16-mixed", "cpu")
    assert fresh.scaler.get_scale() != p.scaler.get_scale()
    fresh.load_state_dict(state)
    assert fresh.state_dict()["scaler"] == state["scaler"]
    # a run without a scaler saved {}; loading it keeps the fresh scaler as it is
    untouched = precision_for("16-mixed", "cpu")
    scale = untouched.state_dict()["scaler"]["scale"]
    untouched.load_state_dict({})
    assert untouched.state_dict()["scaler"]["scale"] == scale


def test_precisions_without_scaler_have_empty_state():
    for name in ("32-true", "64-true", "bf16-mixed", "bf16-true"):
        p = precision_for(name, "cpu")
        assert p.state_dict() == {}
        p.load_state_dict({"scaler": {"scale": 4.0}})  # ignored, no error
        p.teardown()


def test_base_optimizer_step_passes_the_closure():
    model = nn.Linear(2, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=2)
    calls = []

    def closure():
        opt.zero_grad()
        loss = model(torch.ones(3, 2)).pow(2).sum()
        loss.backward()
        calls.append(loss.item())
        return loss

    result = Precision().optimizer_step(opt, closure=closure)
    assert len(calls) >= 1 and result.item() == calls[0]


# ------------------------------------------------------------------ device checks


def test_fp16_on_cpu_unsupported_build_is_refused(monkeypatch):
    monkeypatch.setattr(precision_module, "_fp16_on_cpu_works", lambda mode: False)
    for name in ("16-mixed", 16, "16-true"):
        with pytest.raises(ConfigurationError, match=r"not supported by this torch build.*'bf16-mixed' or '32-true'"):
            precision_for(name, "cpu")
    assert precision_for("bf16-mixed", "cpu").name == "bf16-mixed"  # other modes are unaffected


def test_fp16_probe_is_cached():
    precision_module._fp16_on_cpu_works("16-mixed")
    hits = precision_module._fp16_on_cpu_works.cache_info().hits
    precision_for("16-mixed", "cpu")
    assert precision_module._fp16_on_cpu_works.cache_info().hits == hits + 1


def test_bf16_on_a_cuda_device_without_bf16_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Old GPU")
    for name in ("bf16-mixed", "bf16", "bf16-true"):
        with pytest.raises(ConfigurationError, match=r"Old GPU.*'16-mixed'"):
            precision_for(name, "cuda")


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device here: checks 16-mixed on CUDA trains with a CUDA GradScaler")
def test_cuda_16_mixed_trains_with_a_cuda_scaler():
    p = precision_for("16-mixed", "cuda")
    assert p.scaler is not None and p.device_type == "cuda"
    model = nn.Linear(4, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with p.forward_context():
        out = model(torch.randn(8, 4, device="cuda"))
    assert out.dtype == torch.float16
    p.backward(out.float().pow(2).mean(), model)
    p.optimizer_step(opt)
    assert model.weight.dtype == torch.float32


@pytest.mark.parametrize(("plugin", "dtype"), [
    (DoublePrecision(), torch.float64), (HalfPrecision("bf16-true"), torch.bfloat16), (Precision(), torch.float32),
    (MixedPrecision("bf16-mixed", device_type="cpu"), torch.float32),
])
def test_module_init_context_creates_parameters_in_the_precisions_dtype(plugin, dtype):
    before = torch.get_default_dtype()
    with plugin.module_init_context():
        layer = torch.nn.Linear(2, 2)
        assert torch.get_default_dtype() == dtype
    assert layer.weight.dtype == layer.bias.dtype == dtype
    assert torch.get_default_dtype() == before  # restored, also after an error inside:
    with pytest.raises(RuntimeError), plugin.tensor_init_context():
        raise RuntimeError
    assert torch.get_default_dtype() == before
def test_precision_init_contexts_set_the_parameter_dtype_and_the_strategy_uses_them():
    """Lightning's plugin hooks: ``module_init_context``/``tensor_init_context``; a subclass's override is what the
    strategy's ``tensor_init_context`` (around ``configure_model``) applies."""
    from torchfleet.precision import TruePrecision
    from torchfleet.strategies import SingleDeviceStrategy

    with TruePrecision("64-true").module_init_context():
        assert torch.get_default_dtype() == torch.float64
        layer = torch.nn.Linear(2, 2)
    assert layer.weight.dtype == torch.float64 and torch.get_default_dtype() == torch.float32

    class BFloat16Init(Precision):
        def tensor_init_context(self):
            return TruePrecision("bf16-true").tensor_init_context()

    with SingleDeviceStrategy(device="cpu", precision=BFloat16Init()).tensor_init_context():
        layer = torch.nn.Linear(2, 2)
    assert layer.weight.dtype == torch.bfloat16
