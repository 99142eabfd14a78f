"""ThroughputMonitor: samples/s, batches/s, tokens/s, TFLOP/s and MFU."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from torchfleet.errors import check_flag, check_int, check_number, not_valid
from torchfleet.trainer.callbacks.base import Callback
from torchfleet.trainer.logging import infer_batch_size

#: the clock the rates are measured with (a test may replace it)
_clock = time.perf_counter


class ThroughputMonitor(Callback):
    """Measure training throughput over a sliding window of batches, per process and for the whole world.

    ``batch_size_fn(batch)`` counts samples (default: length of the first tensor),
    ``length_fn(batch)`` counts tokens. The FLOPs of one batch on one device are ``flops_per_batch`` when given,
    else the module's ``flops_per_batch`` attribute (as in Lightning), else, with ``measure_flops=True``, the
    FLOPs torch's ``FlopCounterMode`` counts during the first training batch (forward, backward and optimizer
    step; that batch runs under the counter, no extra work is done). With FLOPs known, ``throughput/tflops_per_sec``
    is logged, and ``throughput/mfu`` (model FLOPs utilisation) where the device's peak is known: ``available_flops``
    (FLOP/s of one device) or ``torchfleet.utilities.throughput.get_available_flops`` for the run's device and
    precision, looked up once when training starts. Results are in ``.metrics`` and logged every
    ``log_every_n_steps``.
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        length_fn: Callable[[Any], int] | None = None,
        flops_per_batch: float | None = None,
        window_size: int = 100,
        available_flops: float | None = None,
        measure_flops: bool = False,
    ) -> None:
        for name, fn in (("batch_size_fn", batch_size_fn), ("length_fn", length_fn)):
            if fn is not None and not callable(fn):
                raise not_valid(name, fn, "give a function of the batch that returns a count, or None",
                                "ThroughputMonitor")
        check_number("flops_per_batch", flops_per_batch, 0, "ThroughputMonitor", allow_none=True)
        check_int("window_size", window_size, 1, "ThroughputMonitor", meaning="batches the rates are measured over")
        check_number("available_flops", available_flops, 0, "ThroughputMonitor", allow_none=True,
                     meaning="peak FLOP/s of one device")
        check_flag("measure_flops", measure_flops, "ThroughputMonitor")
        self.batch_size_fn = batch_size_fn or infer_batch_size
        self.length_fn = length_fn
        self.flops_per_batch = flops_per_batch
        self.available_flops = available_flops
        self.measure_flops = measure_flops
        self.window: deque[tuple[float, int, int]] = deque(maxlen=window_size + 1)
        self.metrics: dict[str, float] = {}
        self.samples = 0
        self.tokens = 0
        self._peak: float | None = available_flops
        self._counter: Any = None

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self.window.clear()
        self.samples = self.tokens = 0
        if self.available_flops is None:
            from torchfleet.utilities.throughput import get_available_flops

            self._peak = get_available_flops(trainer.strategy.root_device, trainer.precision_plugin.compute_dtype)

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if self.measure_flops and self.flops_per_batch is None and self._counter is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._counter = FlopCounterMode(display=False)
            self._counter.__enter__()

    def _stop_counting(self) -> None:
        counter, self._counter = self._counter, None
        if counter is not None:
            counter.__exit__(None, None, None)
            if self.flops_per_batch is None:
                self.flops_per_batch = float(counter.get_total_flops())

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self._counter = None

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._counter is not None:
            self._stop_counting()
        self.samples += self.batch_size_fn(batch)
        if self.length_fn is not None:
            self.tokens += self.length_fn(batch)
        self.window.append((_clock(), self.samples, self.tokens))
        if len(self.window) < 2:
            return
        (t0, s0, k0), (t1, s1, k1) = self.window[0], self.window[-1]
        elapsed = t1 - t0
        if elapsed <= 0:
            return
        batches = len(self.window) - 1
        world = trainer.world_size
        m = {"throughput/batches_per_sec": batches / elapsed, "throughput/samples_per_sec": (s1 - s0) / elapsed}
        m["throughput/global_samples_per_sec"] = m["throughput/samples_per_sec"] * world
        if self.length_fn is not None:
            m["throughput/tokens_per_sec"] = (k1 - k0) / elapsed
            m["throughput/global_tokens_per_sec"] = m["throughput/tokens_per_sec"] * world
        flops = self.flops_per_batch
        if flops is None:
            flops = getattr(module, "flops_per_batch", None)
        if flops is not None:
            m["throughput/flops_per_sec"] = flops * batches / elapsed
            m["throughput/global_flops_per_sec"] = m["throughput/flops_per_sec"] * world
            m["throughput/tflops_per_sec"] = m["throughput/flops_per_sec"] / 1e12
            if self._peak:
                m["throughput/mfu"] = m["throughput/flops_per_sec"] / self._peak
        self.metrics = m
        if trainer.is_global_zero and trainer.global_step % trainer.log_every_n_steps == 0:
            for lg in trainer.loggers:
                lg.log_metrics(m, step=trainer.global_step)
