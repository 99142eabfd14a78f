"""ThroughputMonitor: samples/s, batches/s, and tokens/s or FLOP/s when told how to count them."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from torchfleet.errors import check_int, check_number, not_valid
from torchfleet.trainer.callbacks.base import Callback
from torchfleet.trainer.logging import infer_batch_size


class ThroughputMonitor(Callback):
    """Measure training throughput over a sliding window of batches, per process and for the whole world.

    ``batch_size_fn(batch)`` counts samples (default: length of the first tensor),
    ``length_fn(batch)`` counts tokens, ``flops_per_batch`` gives the FLOPs of one batch.
    Results are in ``.metrics`` and logged every ``log_every_n_steps``.
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        length_fn: Callable[[Any], int] | None = None,
        flops_per_batch: float | None = None,
        window_size: int = 100,
    ) -> None:
        for name, fn in (("batch_size_fn", batch_size_fn), ("length_fn", length_fn)):
            if fn is not None and not callable(fn):
                raise not_valid(name, fn, "give a function of the batch that returns a count, or None",
                                "ThroughputMonitor")
        check_number("flops_per_batch", flops_per_batch, 0, "ThroughputMonitor", allow_none=True)
        check_int("window_size", window_size, 1, "ThroughputMonitor", meaning="batches the rates are measured over")
        self.batch_size_fn = batch_size_fn or infer_batch_size
        self.length_fn = length_fn
        self.flops_per_batch = flops_per_batch
        self.window: deque[tuple[float, int, int]] = deque(maxlen=window_size + 1)
        self.metrics: dict[str, float] = {}
        self.samples = 0
        self.tokens = 0

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self.window.clear()
        self.samples = self.tokens = 0

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.samples += self.batch_size_fn(batch)
        if self.length_fn is not None:
            self.tokens += self.length_fn(batch)
        self.window.append((time.perf_counter(), self.samples, self.tokens))
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
        if self.flops_per_batch is not None:
            m["throughput/flops_per_sec"] = self.flops_per_batch * batches / elapsed
            m["throughput/global_flops_per_sec"] = m["throughput/flops_per_sec"] * world
        self.metrics = m
        if trainer.is_global_zero and trainer.global_step % trainer.log_every_n_steps == 0:
            for lg in trainer.loggers:
                lg.log_metrics(m, step=trainer.global_step)
