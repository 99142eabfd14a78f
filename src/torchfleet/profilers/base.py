"""Profiler: the interface (start/stop an action, summary, describe) and PassThroughProfiler, which records nothing."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("torchfleet")


class Profiler:
    """Records named actions (hooks, steps) of a run; subclass it and implement ``start``, ``stop`` and ``summary``.

    Args:
        dirpath: the folder of the report; None: the Trainer's log folder (``trainer.log_dir``).
        filename: the report's name stem; the file is ``<stage>-<filename>.txt``, with ``-<rank>`` before
            ``.txt`` when more than one process runs (every rank writes its own). Default "profile".
    """

    #: whether the Trainer should time its hooks and steps with this profiler (PassThroughProfiler: no)
    records = True

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None) -> None:
        self.dirpath = os.fspath(dirpath) if dirpath is not None else None
        self.filename = filename
        self._stage: str | None = None
        self._rank: int | None = None
        self._is_global_zero = True

    # -- recording ------------------------------------------------------------------------------
    def start(self, action_name: str) -> None:
        """Start timing ``action_name``."""
        raise NotImplementedError

    def stop(self, action_name: str) -> None:
        """Stop timing ``action_name`` (the innermost running action of that name)."""
        raise NotImplementedError

    def summary(self) -> str:
        """The report's text."""
        return ""

    @contextlib.contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        """Time the ``with`` block as ``action_name``: ``with trainer.profiler.profile("load"): ...``."""
        self.start(action_name)
        try:
            yield action_name
        finally:
            self.stop(action_name)

    def wrap(self, action_name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed as ``action_name`` at every call (the Trainer wraps its hooks once per stage)."""
        start, stop = self.start, self.stop

        def profiled(*args: Any, **kwargs: Any) -> Any:
            start(action_name)
            try:
                return fn(*args, **kwargs)
            finally:
                stop(action_name)

        profiled.__wrapped__ = fn  # type: ignore[attr-defined]
        return profiled

    # -- a stage -------------------------------------------------------------------------------
    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None,
              is_global_zero: bool | None = None) -> None:
        """Called by the Trainer when a stage starts. ``local_rank`` (Lightning's name) is the process's
        global rank when several processes run, else None; ``log_dir`` is used when ``dirpath`` is None."""
        self._stage = stage
        self._rank = local_rank
        self._is_global_zero = (local_rank in (None, 0)) if is_global_zero is None else is_global_zero
        self.dirpath = self.dirpath or log_dir

    def _prepare_filename(self, action_name: str | None = None, extension: str = ".txt") -> str:
        parts = [p for p in (self._stage, self.filename or "profile") if p]
        if self._rank is not None:
            parts.append(str(self._rank))
        if action_name is not None:
            parts.append(action_name)
        return "-".join(parts) + extension

    @property
    def report_path(self) -> str | None:
        """Where ``describe`` writes this rank's report (None before ``setup`` and without a folder)."""
        return os.path.join(self.dirpath, self._prepare_filename()) if self.dirpath else None

    def describe(self) -> None:
        """Write this rank's report to ``report_path``; rank 0 also logs it. Called when a stage ends."""
        text = self.summary()
        if not text:
            return
        path = self.report_path
        if path is not None:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "a") as f:
                f.write(text)
        if self._is_global_zero:
            others = " (each rank writes its own, with its rank in the name)" if self._rank is not None else ""
            log.info("%s%s", text, f"Report written to {path}{others}" if path else "")

    def teardown(self, stage: str | None) -> None:
        """Called after ``describe`` when a stage ends: release what the stage held."""

    @property
    def local_rank(self) -> int:
        return 0 if self._rank is None else self._rank


class PassThroughProfiler(Profiler):
    """Records nothing (the default): ``profile()`` blocks in user code still work and cost nothing."""

    records = False

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass

    def wrap(self, action_name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn
