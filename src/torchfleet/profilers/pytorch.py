"""PyTorchProfiler: torch.profiler over a stage, each action a named range; a Chrome trace per rank."""

from __future__ import annotations

import os
from typing import Any

import torch

from torchfleet.profilers.base import Profiler


class PyTorchProfiler(Profiler):
    """Runs ``torch.profiler.profile`` for the whole stage and marks every action with ``record_function``, so
    the operators each hook and step ran are grouped under its name. The report is torch's operator table;
    each rank also writes a Chrome trace, ``<stage>-<filename>[-<rank>].pt.trace.json`` beside it (open it in
    https://ui.perfetto.dev or chrome://tracing).

    Recording every operator of a long fit takes memory: for long runs pass a ``schedule``
    (``torch.profiler.schedule(wait=1, warmup=1, active=3)``); the schedule advances once per training step.

    Args:
        dirpath, filename: where the report and the trace go (see ``Profiler``).
        export_to_chrome: write the trace.
        row_limit: rows of the operator table (-1: all).
        sort_by_key: the table's sort column; default ``"cpu_time_total"`` (``"cuda_time_total"`` on CUDA).
        profiler_kwargs: passed to ``torch.profiler.profile`` (``activities``, ``schedule``, ``record_shapes``,
            ``profile_memory``, ``with_stack``, ...).
    """

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None,
                 export_to_chrome: bool = True, row_limit: int = 20, sort_by_key: str | None = None,
                 **profiler_kwargs: Any) -> None:
        super().__init__(dirpath, filename)
        self.export_to_chrome = export_to_chrome
        self.row_limit = row_limit
        self.sort_by_key = sort_by_key
        self.profiler_kwargs = profiler_kwargs
        self.profiler: Any = None
        self._ranges: dict[str, list[Any]] = {}
        self._table = ""

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None,
              is_global_zero: bool | None = None) -> None:
        super().setup(stage, local_rank, log_dir, is_global_zero)
        from torch.profiler import ProfilerActivity, profile

        kwargs = dict(self.profiler_kwargs)
        if "activities" not in kwargs:
            kwargs["activities"] = [ProfilerActivity.CPU] + (
                [ProfilerActivity.CUDA] if torch.cuda.is_available() and torch.cuda.is_initialized() else [])
        if kwargs.get("schedule") is not None and "on_trace_ready" not in kwargs and self.export_to_chrome:
            # a schedule records in cycles: each cycle's trace is written when it ends
            def write_cycle(prof: Any) -> None:
                if self.dirpath:
                    os.makedirs(self.dirpath, exist_ok=True)
                    prof.export_chrome_trace(os.path.join(
                        self.dirpath, self._prepare_filename(extension=f"-step{prof.step_num}.pt.trace.json")))

            kwargs["on_trace_ready"] = write_cycle
        self.profiler = profile(**kwargs)
        self.profiler.__enter__()
        self._ranges = {}
        self._table = ""

    def start(self, action_name: str) -> None:
        if self.profiler is None:  # used outside a Trainer stage
            return
        rng = torch.autograd.profiler.record_function(action_name)
        rng.__enter__()
        self._ranges.setdefault(action_name, []).append(rng)

    def stop(self, action_name: str) -> None:
        stack = self._ranges.get(action_name)
        if not stack:
            return
        stack.pop().__exit__(None, None, None)
        if action_name.endswith(".training_step") and self.profiler_kwargs.get("schedule") is not None:
            self.profiler.step()

    @property
    def trace_path(self) -> str | None:
        """Where this rank's Chrome trace goes."""
        return os.path.join(self.dirpath, self._prepare_filename(extension=".pt.trace.json")) if self.dirpath else None

    def _finish(self) -> None:
        prof, self.profiler = self.profiler, None
        if prof is None:
            return
        for stack in self._ranges.values():
            while stack:
                stack.pop().__exit__(None, None, None)
        prof.__exit__(None, None, None)
        events = prof.key_averages()
        if not len(events):
            return
        cuda = any(a == torch.profiler.ProfilerActivity.CUDA for a in prof.activities)
        sort_by = self.sort_by_key or ("cuda_time_total" if cuda else "cpu_time_total")
        title = f"{(self._stage or '').upper()} Profiler Report".strip()
        if self._rank is not None:
            title += f" (rank {self._rank})"
        self._table = f"{title}\n{events.table(sort_by=sort_by, row_limit=self.row_limit)}\n"
        path = self.trace_path
        if self.export_to_chrome and path is not None and self.profiler_kwargs.get("schedule") is None:
            os.makedirs(self.dirpath or ".", exist_ok=True)
            prof.export_chrome_trace(path)

    def summary(self) -> str:
        self._finish()
        return self._table

    def teardown(self, stage: str | None) -> None:
        self._finish()
