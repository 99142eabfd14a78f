"""FLOPs and MFU: measure_flops (against hand counts and Lightning's), the peak-FLOPs table, Throughput,
ThroughputMonitor's TFLOP/s and MFU, and the progress bar's samples/s."""

from __future__ import annotations

import itertools
import re
import resource

import pytest
import torch
from torch import nn

from tests.helpers import Regressor, loader, quiet
from tests.lightning_reference import finish, needs_lightning, run_here, start_in_lightning
from torchfleet import Trainer
from torchfleet.callbacks import ProgressBar, ThroughputMonitor
from torchfleet.loggers import Logger
from torchfleet.utilities import measure_flops
from torchfleet.utilities.throughput import Throughput, get_available_flops, peak_flops_key

WIDTHS = [32, 64, 48, 10]
BATCH = 8


def _linear_stack() -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(WIDTHS):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _matmul_flops() -> list[int]:
    """2*m*n*k per Linear: m = batch, k = in features, n = out features."""
    return [2 * BATCH * a * b for a, b in itertools.pairwise(WIDTHS)]


def test_measure_flops_on_a_linear_stack_equals_the_hand_count():
    with torch.device("meta"):
        model = _linear_stack()
        x = torch.randn(BATCH, WIDTHS[0])
    forward = sum(_matmul_flops())
    assert measure_flops(model, lambda: model(x)) == forward
    # backward: a gradient for the weight and one for the input of every layer, each as costly as the forward
    # matmul; the first layer's input (the data) needs no gradient
    assert measure_flops(model, lambda: model(x), torch.Tensor.sum) == 3 * forward - _matmul_flops()[0]
    x.requires_grad_(True)
    assert measure_flops(model, lambda: model(x), torch.Tensor.sum) == 3 * forward


def test_measure_flops_on_meta_allocates_nothing():
    with torch.device("meta"):
        # 800M parameters: 3.2 GB if anything were real
        model = nn.Sequential(nn.Linear(20_000, 20_000), nn.Linear(20_000, 20_000))
        x = torch.randn(4, 20_000)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    flops = measure_flops(model, lambda: model(x), torch.Tensor.sum)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert flops == 2 * 4 * 20_000 * 20_000 * (2 + 3)  # forward of both; backward: weights of both, input of one
    assert grown_mib < 100, f"peak memory grew by {grown_mib:.0f} MiB"
    assert all(p.is_meta and p.grad.is_meta for p in model.parameters())


_COMPARE = """
import torch
from torch import nn
from {module} import measure_flops

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        h = self.conv(x).flatten(2).transpose(1, 2)
        h, _ = self.attn(h, h, h)
        return self.head(h.mean(1))

with torch.device("meta"):
    net = Net()
    x = torch.randn(4, 3, 12, 12)
print(measure_flops(net, lambda: net(x)), measure_flops(net, lambda: net(x), lambda y: y.sum()))
"""


@needs_lightning
def test_measure_flops_equals_lightnings():
    lightning = start_in_lightning(_COMPARE.format(module="lightning.fabric.utilities.throughput"))
    ours = run_here(_COMPARE.format(module="torchfleet.utilities"))
    lightning = finish(lightning)
    fwd, total = map(int, ours.split())
    assert ours == lightning and 0 < fwd < total


@pytest.mark.parametrize(("name", "key"), [
    ("NVIDIA H100 80GB HBM3", "h100 sxm"), ("NVIDIA H100 PCIe", "h100 pcie"), ("NVIDIA H100 NVL", "h100 nvl"),
    ("NVIDIA H200", "h200 sxm"), ("NVIDIA H200 NVL", "h200 nvl"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"), ("NVIDIA L40S", "l40s"), ("NVIDIA L40", "l40"), ("NVIDIA L4", "l4"),
    ("Tesla V100-SXM2-16GB", "v100 sxm"), ("Tesla V100-PCIE-32GB", "v100 pcie"),
    ("Tesla V100S-PCIE-32GB", "v100s pcie"), ("AMD Instinct MI300X", "mi300x"), ("NVIDIA A10G", None),
    ("NVIDIA GeForce GTX 1080", None),
])
def test_device_names_find_their_peak_row(name, key):
    assert peak_flops_key(name) == key


def test_available_flops_by_device_and_dtype(monkeypatch):
    assert get_available_flops(torch.device("cpu"), torch.float32) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    # the H100 SXM datasheet: 1,979 bf16 and 989 tf32 TFLOPS with sparsity (dense: half), 67 fp32 TFLOPS
    assert get_available_flops("cuda:0", torch.bfloat16) == pytest.approx(1979e12 / 2, rel=1e-3)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert get_available_flops("cuda:0", torch.float32) == 67e12
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert get_available_flops("cuda:0", torch.float32) == pytest.approx(989e12 / 2, rel=1e-3)
    assert get_available_flops("cuda:0", torch.int8) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    with pytest.warns(UserWarning, match="available_flops="):
        assert get_available_flops("cuda:0", torch.bfloat16) is None


def test_throughput_rates_over_its_window():
    tp = Throughput(available_flops=100.0, world_size=2, window_size=3)
    for i in range(1, 5):  # a batch of 4 samples, 16 items and 10 FLOPs every 0.5 s
        tp.update(time=0.5 * i, batches=i, samples=4 * i, lengths=16 * i, flops=10)
    m = tp.compute()
    assert m["device/batches_per_sec"] == 2 and m["device/samples_per_sec"] == 8
    assert m["device/items_per_sec"] == 32 and m["device/flops_per_sec"] == 20
    assert m["device/mfu"] == 0.2 and m["samples_per_sec"] == 16 and m["flops_per_sec"] == 40
    assert (m["time"], m["batches"], m["samples"], m["lengths"]) == (2.0, 4, 16, 64)
    with pytest.raises(ValueError, match="must increase"):
        tp.update(time=1.0, batches=5, samples=20)


class Recorder(Logger):
    name = "rec"
    version = 0

    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))


@pytest.fixture
def half_second_batches(monkeypatch):
    """The monitor's clock: each batch ends 0.5 s after the previous one."""
    import torchfleet.trainer.callbacks.throughput as module

    ticks = itertools.count()
    monkeypatch.setattr(module, "_clock", lambda: 0.5 * next(ticks))


def test_monitor_logs_tflops_and_mfu(half_second_batches):
    rec = Recorder()
    tm = ThroughputMonitor(flops_per_batch=3e12, available_flops=12e12, window_size=4)
    kw = {k: v for k, v in quiet().items() if k != "logger"}
    Trainer(max_epochs=1, logger=rec, log_every_n_steps=2, callbacks=[tm], **kw).fit(Regressor(), loader(64, 8))
    # 3e12 FLOPs per 0.5 s batch: 6 TFLOP/s of a 12 TFLOP/s device
    assert tm.metrics["throughput/tflops_per_sec"] == pytest.approx(6.0)
    assert tm.metrics["throughput/mfu"] == pytest.approx(0.5)
    assert tm.metrics["throughput/samples_per_sec"] == pytest.approx(16.0)
    logged = [m for _, m in rec.rows if "throughput/mfu" in m]
    assert len(logged) == 4 and all(m["throughput/mfu"] == pytest.approx(0.5) for m in logged)


def test_monitor_measures_the_first_batch_once(half_second_batches):
    tm = ThroughputMonitor(measure_flops=True, available_flops=1e6, window_size=2)
    Trainer(max_epochs=1, callbacks=[tm], **quiet()).fit(Regressor(), loader(32, 8))
    # Regressor: Linear(8, 16), Linear(16, 1) on 8 samples; the backward computes both weights' gradients and
    # the second layer's input gradient (the data needs none); the optimizer step has no matmul
    fwd1, fwd2 = 2 * 8 * 8 * 16, 2 * 8 * 16 * 1
    assert tm.flops_per_batch == fwd1 + fwd2 + fwd1 + 2 * fwd2
    assert tm.metrics["throughput/mfu"] == pytest.approx(tm.flops_per_batch / 0.5 / 1e6)
    assert tm._counter is None


def test_monitor_reads_the_modules_flops_and_has_no_peak_on_cpu(half_second_batches):
    model = Regressor()
    model.flops_per_batch = 5e11  # Lightning's way: an attribute of the module
    tm = ThroughputMonitor(window_size=2)
    Trainer(max_epochs=1, callbacks=[tm], **quiet()).fit(model, loader(32, 8))
    assert tm.metrics["throughput/tflops_per_sec"] == pytest.approx(1.0)
    assert "throughput/mfu" not in tm.metrics


def _fit_with_bar(bar, monkeypatch, callbacks=()):
    import torchfleet.trainer.callbacks.progress as progress

    ticks = itertools.count()
    monkeypatch.setattr(progress, "_clock", lambda: 0.25 * next(ticks))  # a batch every 0.25 s
    trainer = Trainer(accelerator="cpu", max_epochs=1, callbacks=[bar, *callbacks], enable_progress_bar=True,
                      enable_model_summary=False, logger=False, enable_checkpointing=False, num_sanity_val_steps=0)
    trainer.fit(Regressor(), loader(64, 8))


def test_progress_bar_shows_samples_per_second(monkeypatch, capsys):
    _fit_with_bar(ProgressBar(refresh_interval=0.0), monkeypatch)
    err = capsys.readouterr().err
    shown = re.findall(r"samples/s=([0-9.e+]+)", err)
    assert len(shown) >= 8 and set(shown) == {"32"}  # 8 samples every 0.25 s
    assert "mfu=" not in err and "tokens/s=" not in err


def test_progress_bar_shows_tokens_and_mfu_from_the_monitor(monkeypatch, capsys, half_second_batches):
    tm = ThroughputMonitor(length_fn=lambda b: b[0].numel(), flops_per_batch=2.0, available_flops=16.0,
                           window_size=2)
    _fit_with_bar(ProgressBar(refresh_interval=0.0), monkeypatch, [tm])
    err = capsys.readouterr().err
    # the monitor's clock: 64 tokens and 2 FLOPs every 0.5 s; MFU 4 / 16
    assert "tokens/s=128" in err and "mfu=25.0%" in err and "samples/s=32" in err


def test_rich_progress_bar_shows_samples_tokens_and_mfu(monkeypatch, half_second_batches):
    pytest.importorskip("rich")
    import io

    from torchfleet.callbacks import RichProgressBar

    out = io.StringIO()
    tm = ThroughputMonitor(length_fn=lambda b: b[0].numel(), flops_per_batch=2.0, available_flops=16.0,
                           window_size=2)
    _fit_with_bar(RichProgressBar(console_kwargs={"file": out, "width": 200}), monkeypatch, [tm])
    text = out.getvalue()
    # as ProgressBar's postfix: 8 samples every 0.25 s; the monitor's 64 tokens and 2 FLOPs every 0.5 s, MFU 4 / 16
    assert "samples/s: 32" in text and "tokens/s: 128" in text and "mfu: 25.0%" in text
