"""Reading checkpoint files without running code from them: torch's weights-only unpickler and what it may build.

A pickle can name any function and have it called while it is read (``__reduce__``), so loading a
file from elsewhere with ``torch.load(weights_only=False)`` can run any command. Every torchfleet
load goes through ``load`` here: ``torch.load(weights_only=True)``, which builds tensors, containers
and numbers only, plus ``standard_globals()``, the few standard classes people keep in checkpoint
extras and Lightning checkpoints' hyperparameters (argparse.Namespace, pathlib paths, frozenset,
OmegaConf's containers). Those are allowed for the duration of one load, never added to the
process's allowlist for good. A file that needs anything else is refused with a CheckpointError
naming what it asked for, before any of it runs.

Opting in, for a file you trust: ``weights_only=False`` on the call that loads it, or
``TorchCheckpointIO(weights_only=False)`` for a whole run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import pathlib
import pickletools
import re
import sys
import zipfile
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from torchfleet.errors import CheckpointError

#: how to load a trusted file anyway; every refusal ends with it
OPT_IN = (
    "If you trust the file, load it with weights_only=False (an argument of fit/validate/test/predict, "
    "Module.load_from_checkpoint and Fleet.load), or for a whole run with "
    "Trainer(plugins=[TorchCheckpointIO(weights_only=False)]); to allow one class of yours only, call "
    "torch.serialization.add_safe_globals([TheClass]) before loading."
)

#: how torch's refusals (and ours) name the global a file asked for
GLOBAL_NAME = re.compile(r"GLOBAL ([\w.]+)")


def standard_globals() -> list[Any]:
    """Standard-library classes that unpickle without running code of the file's choosing."""
    return [argparse.Namespace, pathlib.Path, pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePath,
            pathlib.PurePosixPath, pathlib.PureWindowsPath, frozenset]


def numpy_globals() -> list[Any]:
    """What NumPy arrays and scalars pickle to (older torchfleet checkpoints hold NumPy's RNG state as an array);
    empty where numpy is not installed. Object arrays only hold what the rest of the load may build."""
    if "numpy" not in sys.modules and importlib.util.find_spec("numpy") is None:
        return []
    import numpy

    multiarray = sys.modules.get("numpy._core.multiarray") or sys.modules.get("numpy.core.multiarray")
    if multiarray is None:
        from numpy.core import multiarray
    builders = [multiarray._reconstruct, multiarray.scalar]
    # NumPy 1 wrote these under numpy.core, NumPy 2 under numpy._core: allow both names
    renamed = [(f, f"numpy.{old}.multiarray.{f.__name__}") for f in builders for old in ("core", "_core")]
    dtypes = {type(numpy.dtype(code)) for code in numpy.typecodes["All"]}  # NumPy 2 rebuilds one class per dtype
    return [numpy.ndarray, numpy.dtype, *sorted(dtypes, key=str), *builders, *renamed]


def omegaconf_globals() -> list[Any]:
    """OmegaConf's containers and what they pickle (nodes, metadata); empty where omegaconf is not installed."""
    if "omegaconf" not in sys.modules and importlib.util.find_spec("omegaconf") is None:
        return []
    import collections
    import typing

    from omegaconf import DictConfig, ListConfig, base, nodes

    node_types = [getattr(nodes, n) for n in dir(nodes) if n.endswith("Node") and isinstance(getattr(nodes, n), type)]
    # their pickles also hold defaultdicts of flags and the builtin types they were declared with
    return [DictConfig, ListConfig, base.Metadata, base.ContainerMetadata, *node_types, typing.Any,
            collections.defaultdict, dict, list, tuple, int, float, str, bool, bytes]


@contextlib.contextmanager
def allowing(extra: Iterable[Any]) -> Iterator[None]:
    """Let torch's weights-only unpickler build ``extra`` inside the block; the user's own allowlist stays as it was.

    Only the entries the process has not allowed itself are added, and exactly those are removed again.
    """
    have = set(torch.serialization.get_safe_globals())
    # safe_globals removes on exit what it added: given only what is missing, it leaves the user's entries alone
    with torch.serialization.safe_globals([g for g in dict.fromkeys(extra) if g not in have]):
        yield


def load(source: str | os.PathLike | io.IOBase, *, weights_only: bool = True, map_location: Any = "cpu",
         allow: Iterable[Any] = (), mmap: bool = False, what: str | None = None) -> Any:
    """``torch.load`` of ``source``: with ``weights_only`` (the default) running no code from the file.

    ``allow`` adds classes this caller's files are known to hold (DeepSpeed's, for instance). A refusal
    raises CheckpointError naming the global the file asked for and how to opt in; ``what`` names the
    source in it (default: the path).
    """
    if not weights_only:
        return torch.load(source, map_location=map_location, weights_only=False, mmap=mmap or None)
    allowed = [*standard_globals(), *allow]
    try:
        with allowing(allowed):
            return torch.load(source, map_location=map_location, weights_only=True, mmap=mmap or None)
    except Exception as exc:
        if not _is_refusal(exc):
            raise
        names = _refused_names(exc, source)
        # NumPy's and OmegaConf's classes are imported only for the files that hold them
        extra = [g for prefix, found in (("numpy.", numpy_globals), ("omegaconf.", omegaconf_globals))
                 if any(n.startswith(prefix) for n in names) for g in found()]
        if extra and not set(extra) <= set(allowed) and isinstance(source, (str, os.PathLike)):
            return load(source, map_location=map_location, allow=[*allow, *extra], mmap=mmap, what=what)
        raise refusal(what or _describe(source), names, exc) from None


def _is_refusal(exc: BaseException) -> bool:
    import pickle

    return isinstance(exc, pickle.UnpicklingError) and "weights only load failed" in str(exc).lower()


def _describe(source: Any) -> str:
    return repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else "the checkpoint data"


def refusal(what: str, names: list[str], exc: BaseException | None = None) -> CheckpointError:
    """The one-paragraph error for a file that safe loading refused because it asked for ``names``."""
    if names:
        asked = (f"it asks to import and call {', '.join(map(repr, names[:4]))}"
                 f"{' and more' if len(names) > 4 else ''}, which could run code of the file's choosing")
    else:
        reason = _torch_reason(exc) if exc is not None else ""
        asked = f"it holds pickle data that only a full unpickler reads ({reason or 'an unsupported construct'})"
    return CheckpointError(
        f"{what} was not loaded: {asked}. torchfleet loads checkpoints with torch.load(weights_only=True), which "
        "builds tensors, plain Python values and a few standard classes only (torchfleet's own entries never need "
        f"more). {OPT_IN}"
    )


def _torch_reason(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        line = line.strip()
        if line and not line.startswith(("Weights only load failed", "Please file an issue", "Check the documentation",
                                          "In PyTorch 2.6")) and "WeightsUnpickler error" not in line:
            return line.rstrip(".")
    return ""


def _refused_names(exc: BaseException, source: Any) -> list[str]:
    """The globals a refused file asks for: the one torch named, else those found by reading its pickle's opcodes."""
    named = GLOBAL_NAME.findall(str(exc))
    if named:
        return list(dict.fromkeys(named))
    if isinstance(source, (str, os.PathLike)):
        try:
            return globals_in(source)
        except Exception:  # noqa: BLE001  (naming is a courtesy: the refusal stands without it)
            return []
    return []


def globals_in(path: str | os.PathLike) -> list[str]:
    """Every ``module.name`` the pickle inside a torch.save zip file refers to, found without unpickling it.

    Torch's own scan reads GLOBAL opcodes only; pickles of protocol 4 and later name globals with
    STACK_GLOBAL, whose two strings are the last two pushed before it.
    """
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in standard_globals()} | _torch_defaults()
    with zipfile.ZipFile(os.fspath(path)) as archive:
        name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        data = archive.read(name)
    found: list[str] = []
    strings: list[str] = []
    for opcode, arg, _ in pickletools.genops(data):
        if opcode.name == "GLOBAL":
            found.append(str(arg).replace(" ", "."))
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            found.append(f"{strings[-2]}.{strings[-1]}")
        elif isinstance(arg, str):
            strings.append(arg)
    return [g for g in dict.fromkeys(found) if g not in allowed]


def _torch_defaults() -> set[str]:
    try:  # what torch's weights-only unpickler builds without being asked (tensor rebuilders, dtypes, ...)
        from torch._weights_only_unpickler import _get_allowed_globals

        return set(_get_allowed_globals())
    except (ImportError, AttributeError):
        return set()
