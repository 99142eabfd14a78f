"""FLOPs of a training step and the peak FLOP/s of a device: ``measure_flops``, ``get_available_flops``, ``Throughput``.

Lightning keeps these in ``lightning.fabric.utilities.throughput`` (``measure_flops`` is also exported from
``lightning.pytorch.utilities``); here they are ``torchfleet.utilities.throughput`` and ``torchfleet.utilities``.
``ThroughputMonitor`` (torchfleet.callbacks) uses them to log TFLOP/s and MFU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from torchfleet.rank_zero import rank_zero_warn

__all__ = ["PEAK_FLOPS", "Throughput", "get_available_flops", "measure_flops", "peak_flops_key"]


def measure_flops(model: torch.nn.Module, forward_fn: Callable[[], Any],
                  loss_fn: Callable[[Any], torch.Tensor] | None = None) -> int:
    """The FLOPs of ``forward_fn()`` (and, given ``loss_fn``, of ``loss_fn(output).backward()`` too), counted by
    torch's ``FlopCounterMode`` (matrix products, convolutions, attention; elementwise work is not counted).

    Build the model and its input on the meta device to count without allocating or computing anything::

        with torch.device("meta"):
            model = Net()
            x = torch.randn(8, 512)
        per_batch = measure_flops(model, lambda: model(x), loss_fn=torch.Tensor.sum)

    ``model`` is not used by the count (it is Lightning's signature); the count is of what the functions run.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = forward_fn()
        if loss_fn is not None:
            loss_fn(out).backward()
    return counter.get_total_flops()


# Dense (no structured sparsity) peak FLOP/s per device, as the vendors' datasheets give them. The datasheets quote
# tensor-core figures "with sparsity" (twice the dense rate) next to or instead of dense ones; those are halved
# here. "tf32" is float32 matmuls on tensor cores, used when torch.get_float32_matmul_precision() is not "highest".
# NVIDIA H100 datasheet (SXM5 / PCIe / NVL, per GPU); NVIDIA H200 datasheet (SXM / NVL); NVIDIA A100 datasheet (SXM4
# and PCIe share the figures); NVIDIA L40S, L40, L4, A10 and V100 datasheets; AMD Instinct MI300X, MI325X and MI250X
# datasheets (matrix-core figures, dense). An A10G (AWS) is not in NVIDIA's datasheets and is left out (None).
_TF = 1e12
# the H200 computes at the H100's rates (SXM and NVL alike); it has more and faster memory
_HOPPER_SXM = {torch.float64: 34 * _TF, torch.float32: 67 * _TF, "tf32": 494.5 * _TF,
               torch.bfloat16: 989.5 * _TF, torch.float16: 989.5 * _TF}
_HOPPER_NVL = {torch.float64: 30 * _TF, torch.float32: 60 * _TF, "tf32": 417.5 * _TF,
               torch.bfloat16: 835.5 * _TF, torch.float16: 835.5 * _TF}
PEAK_FLOPS: dict[str, dict[str | torch.dtype, float]] = {
    "h200 sxm": _HOPPER_SXM,
    "h200 nvl": _HOPPER_NVL,
    "h100 sxm": _HOPPER_SXM,
    "h100 nvl": _HOPPER_NVL,
    "h100 pcie": {torch.float64: 26 * _TF, torch.float32: 51 * _TF, "tf32": 378 * _TF,
                  torch.bfloat16: 756.5 * _TF, torch.float16: 756.5 * _TF},
    "a100": {torch.float64: 9.7 * _TF, torch.float32: 19.5 * _TF, "tf32": 156 * _TF,
             torch.bfloat16: 312 * _TF, torch.float16: 312 * _TF},
    "l40s": {torch.float32: 91.6 * _TF, "tf32": 183 * _TF, torch.bfloat16: 362.05 * _TF, torch.float16: 362.05 * _TF},
    "l40": {torch.float32: 90.5 * _TF, "tf32": 90.5 * _TF, torch.bfloat16: 181.05 * _TF, torch.float16: 181.05 * _TF},
    "l4": {torch.float32: 30.3 * _TF, "tf32": 60 * _TF, torch.bfloat16: 121 * _TF, torch.float16: 121 * _TF},
    "a10": {torch.float32: 31.2 * _TF, "tf32": 62.5 * _TF, torch.bfloat16: 125 * _TF, torch.float16: 125 * _TF},
    "v100 sxm": {torch.float64: 7.8 * _TF, torch.float32: 15.7 * _TF, torch.float16: 125 * _TF},
    "v100 pcie": {torch.float64: 7 * _TF, torch.float32: 14 * _TF, torch.float16: 112 * _TF},
    "v100s pcie": {torch.float64: 8.2 * _TF, torch.float32: 16.4 * _TF, torch.float16: 130 * _TF},
    "mi300x": {torch.float64: 163.4 * _TF, torch.float32: 163.4 * _TF, "tf32": 653.7 * _TF,
               torch.bfloat16: 1307.4 * _TF, torch.float16: 1307.4 * _TF},
    "mi325x": {torch.float64: 163.4 * _TF, torch.float32: 163.4 * _TF, "tf32": 653.7 * _TF,
               torch.bfloat16: 1307.4 * _TF, torch.float16: 1307.4 * _TF},
    "mi250x": {torch.float64: 95.7 * _TF, torch.float32: 95.7 * _TF, torch.bfloat16: 383 * _TF,
               torch.float16: 383 * _TF},
}


def peak_flops_key(device_name: str) -> str | None:
    """The ``PEAK_FLOPS`` row for a device name as ``torch.cuda.get_device_name`` reports it, or None."""
    name = device_name.lower().replace("-", " ")
    words = name.split()
    for model in ("h200", "h100"):
        if model in words:
            if "nvl" in words:
                return f"{model} nvl"
            if "pcie" in words or "hbm2e" in words:
                return f"{model} pcie"
            return f"{model} sxm"  # "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    if "v100s" in words:
        return "v100s pcie"
    if "v100" in words:
        return "v100 pcie" if "pcie" in words else "v100 sxm"
    for model in ("l40s", "l40", "l4", "a100", "a10", "mi300x", "mi325x", "mi250x"):
        if model in words:
            return model  # "NVIDIA A100-SXM4-80GB" splits into "a100", "sxm4", "80gb"
    return None


def get_available_flops(device: torch.device | str, dtype: torch.dtype | str) -> int | None:
    """Peak dense FLOP/s of one ``device`` computing in ``dtype`` (from ``PEAK_FLOPS``), or None where it is not
    known: a CPU, a GPU not in the table (with a warning), a dtype the device has no figure for.

    float32 on a device with tensor-core float32 ("tf32") counts at that rate unless
    ``torch.get_float32_matmul_precision()`` is "highest". Pass ``available_flops=`` to ``ThroughputMonitor`` to
    give the figure yourself.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    device_name = torch.cuda.get_device_name(device)
    key = peak_flops_key(device_name)
    if key is None:
        rank_zero_warn(f"The peak FLOP/s of {device_name!r} is not known to torchfleet: pass available_flops= "
                       "(FLOP/s of one device) to see MFU.")
        return None
    row = PEAK_FLOPS[key]
    if dtype is torch.float32 and "tf32" in row and torch.get_float32_matmul_precision() != "highest":
        dtype = "tf32"
    return int(row[dtype]) if dtype in row else None


class Throughput:
    """Rates over the last ``window_size`` updates, as Lightning's ``Throughput``: ``update(time=, batches=, samples=,
    lengths=, flops=)`` with running totals (``flops``: this update's FLOPs on one device), ``compute()`` returning
    ``device/batches_per_sec``, ``device/samples_per_sec``, ``device/items_per_sec``, ``device/flops_per_sec``,
    ``device/mfu`` (given ``available_flops``), the totals, and the world's rates when ``world_size`` > 1.
    """

    def __init__(self, available_flops: float | None = None, world_size: int = 1, window_size: int = 100,
                 separator: str = "/") -> None:
        if world_size < 1 or window_size < 2:
            raise ValueError(f"Throughput needs world_size >= 1 and window_size >= 2, got {world_size}, {window_size}")
        self.available_flops = available_flops
        self.world_size = world_size
        self.separator = separator
        self._rows: deque[tuple[float, int, int, int | None]] = deque(maxlen=window_size)
        self._flops: deque[float] = deque(maxlen=window_size)

    def update(self, *, time: float, batches: int, samples: int, lengths: int | None = None,
               flops: float | None = None) -> None:
        if samples < batches or (lengths is not None and lengths < samples):
            raise ValueError(f"Throughput.update needs lengths >= samples >= batches, got {lengths}, {samples}, "
                             f"{batches}")
        if self._rows and (time <= self._rows[-1][0] or batches < self._rows[-1][1] or samples < self._rows[-1][2]):
            raise ValueError(f"Throughput.update: time and the totals must increase, got time={time} after "
                             f"{self._rows[-1][0]}")
        self._rows.append((time, batches, samples, lengths))
        if flops is not None:
            self._flops.append(flops)

    def compute(self) -> dict[str, float]:
        rows = self._rows
        if not rows:
            return {}
        t1, b1, s1, n1 = rows[-1]
        metrics: dict[str, float] = {"time": t1, "batches": b1, "samples": s1}
        if n1 is not None:
            metrics["lengths"] = n1
        d, world = f"device{self.separator}", self.world_size
        rates: dict[str, float] = {}
        if len(rows) == rows.maxlen:
            t0, b0, s0, n0 = rows[0]
            elapsed = t1 - t0
            rates["batches_per_sec"] = (b1 - b0) / elapsed
            rates["samples_per_sec"] = (s1 - s0) / elapsed
            if n1 is not None and n0 is not None:
                rates["items_per_sec"] = (n1 - n0) / elapsed
            if len(self._flops) == self._flops.maxlen:
                # the first update's FLOPs were done before the window's first time stamp
                rates["flops_per_sec"] = (sum(self._flops) - self._flops[0]) / elapsed
        for k, v in rates.items():
            metrics[d + k] = v
            if world > 1:
                metrics[k] = v * world
        if self.available_flops and "flops_per_sec" in rates:
            metrics[d + "mfu"] = rates["flops_per_sec"] / self.available_flops
        return metrics

    def reset(self) -> None:
        self._rows.clear()
        self._flops.clear()


class ThroughputMonitor(Throughput):
    """Fabric's ``ThroughputMonitor(fabric)``: a ``Throughput`` for a launched Fleet, with its world size and its
    device's peak FLOP/s at the precision's compute dtype, that logs through the Fleet's loggers.

    (The Trainer's callback of the same name is ``torchfleet.callbacks.ThroughputMonitor``.)
    """

    def __init__(self, fabric: Any, **kwargs: Any) -> None:
        self._fleet = fabric
        if "available_flops" not in kwargs:
            kwargs["available_flops"] = get_available_flops(fabric.device, fabric.strategy.precision.compute_dtype)
        super().__init__(world_size=fabric.world_size, **kwargs)

    def compute_and_log(self, step: int | None = None, **kwargs: Any) -> dict[str, float]:
        """``update(**kwargs)`` when given, then ``compute()``; the result goes to ``fleet.log_dict`` and is returned."""
        if kwargs:
            self.update(**kwargs)
        metrics = self.compute()
        self._fleet.log_dict(metrics, step=step)
        return metrics
