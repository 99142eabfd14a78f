"""Profilers: time (or trace) every hook and step of a run; ``Trainer(profiler="simple" | "advanced" | "pytorch")``.

Each rank writes its report to ``dirpath/<stage>-<filename>[-<rank>].txt`` (``dirpath`` defaults to the
Trainer's log folder, ``filename`` to "profile"; the rank is added when more than one process runs); rank 0
also logs it. How the Trainer feeds them is in ``trainer/profiling.py``.
"""

from __future__ import annotations

from typing import Any

from torchfleet.errors import ConfigurationError, unknown_name
from torchfleet.profilers.advanced import AdvancedProfiler
from torchfleet.profilers.base import PassThroughProfiler, Profiler
from torchfleet.profilers.pytorch import PyTorchProfiler
from torchfleet.profilers.simple import SimpleProfiler

__all__ = ["AdvancedProfiler", "PassThroughProfiler", "Profiler", "PyTorchProfiler", "SimpleProfiler", "resolve"]

_NAMES: dict[str, type[Profiler]] = {
    "simple": SimpleProfiler,
    "advanced": AdvancedProfiler,
    "pytorch": PyTorchProfiler,
    "passthrough": PassThroughProfiler,
}


def resolve(profiler: Any) -> Profiler:
    """``Trainer(profiler=...)``: None (no profiling), a name, or a ``Profiler`` instance."""
    if profiler is None:
        return PassThroughProfiler()
    if isinstance(profiler, Profiler):
        return profiler
    if isinstance(profiler, str):
        cls = _NAMES.get(profiler.lower())
        if cls is None:
            raise unknown_name("profiler", profiler, _NAMES,
                               "Or pass a Profiler instance, e.g. SimpleProfiler(dirpath=..., filename=...).")
        return cls()
    if isinstance(profiler, type) and issubclass(profiler, Profiler):
        raise ConfigurationError(
            f"profiler={profiler.__name__} is a class; pass an instance, profiler={profiler.__name__}(), or a name: "
            f"{', '.join(repr(n) for n in _NAMES)}."
        )
    raise ConfigurationError(
        f"profiler={profiler!r} is not valid: give None, one of {', '.join(repr(n) for n in _NAMES)}, or an "
        "instance of torchfleet.profilers.Profiler (SimpleProfiler, AdvancedProfiler, PyTorchProfiler or your "
        "own subclass)."
    )
