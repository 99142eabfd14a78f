"""CheckpointIO: how checkpoint dicts reach storage. Atomic local files by default; async on request."""

from __future__ import annotations

import functools
import glob
import inspect
import logging
import os
import shutil
import threading
from abc import ABC, abstractmethod
from typing import Any

import torch

from torchfleet.errors import CheckpointError

log = logging.getLogger(__name__)

PathLike = "str | os.PathLike[str]"


class CheckpointIO(ABC):
    """Saves and loads checkpoint dicts. Subclass it to store checkpoints elsewhere (object stores, ...).

    Subclasses may implement the two-argument forms ``save_checkpoint(checkpoint, path)`` and
    ``load_checkpoint(path)``; torchfleet calls them through ``save_with``/``load_with``, which
    pass only the arguments a method accepts.
    """

    @abstractmethod
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path``."""

    @abstractmethod
    def load_checkpoint(self, path: Any, map_location: Any | None = None) -> dict[str, Any]:
        """Read the checkpoint at ``path``."""

    def remove_checkpoint(self, path: Any) -> None:
        """Delete the checkpoint at ``path`` (a file or a directory); a missing path is not an error."""
        path = os.fspath(path)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.remove(path)

    def teardown(self) -> None:
        """Finish pending work and release resources."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@functools.cache
def _accepted(method: Any, name: str) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def save_with(io: CheckpointIO, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
    """``io.save_checkpoint`` with only the arguments its signature takes (custom two-argument IOs work)."""
    method = type(io).save_checkpoint
    if storage_options is not None and _accepted(method, "storage_options"):
        io.save_checkpoint(checkpoint, path, storage_options=storage_options)
    else:
        io.save_checkpoint(checkpoint, path)


def load_with(io: CheckpointIO, path: Any, map_location: Any | None = None) -> dict[str, Any]:
    """``io.load_checkpoint`` with only the arguments its signature takes."""
    if map_location is not None and _accepted(type(io).load_checkpoint, "map_location"):
        return io.load_checkpoint(path, map_location=map_location)
    return io.load_checkpoint(path)


def temp_name(path: str) -> str:
    """Where a save writes before the rename: beside the target, hidden, and marked with the writer's pid."""
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.tmp-{os.getpid()}")


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _missing(path: str) -> CheckpointError:
    parent = os.path.dirname(os.path.abspath(path))
    near = []
    if os.path.isdir(parent):
        near = sorted(
            os.path.basename(p) for p in glob.glob(os.path.join(parent, "*")) if p.endswith((".ckpt", ".pt", ".pth"))
        )[:5]
    listing = f" Checkpoint files in {parent}: {', '.join(near)}." if near else ""
    return CheckpointError(f"No checkpoint at {path!r}: the path does not exist.{listing}")


class TorchCheckpointIO(CheckpointIO):
    """``torch.save``/``torch.load`` on local files, written atomically.

    The checkpoint goes to a hidden temporary file beside the target, is flushed and fsynced, then
    renamed over the target: a crash mid-save leaves the previous file intact. ``weights_only``
    is passed to ``torch.load``; training checkpoints hold RNG states and hyperparameters, so the
    default is False — load only checkpoints you trust.
    """

    def __init__(self, weights_only: bool = False) -> None:
        self.weights_only = weights_only

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(
                f"TorchCheckpointIO.save_checkpoint takes no storage_options (got {storage_options!r}); a custom "
                "CheckpointIO can use them."
            )
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        tmp = temp_name(path)
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        _fsync_dir(directory)

    def load_checkpoint(self, path: Any, map_location: Any | None = None) -> dict[str, Any]:
        path = os.fspath(path)
        if not os.path.exists(path):
            raise _missing(path)
        if os.path.isdir(path):
            raise CheckpointError(
                f"{path!r} is a directory; TorchCheckpointIO reads checkpoint files. A sharded (directory) checkpoint "
                "is read by the strategy that wrote it."
            )
        try:
            return torch.load(path, map_location=map_location, weights_only=self.weights_only)
        except Exception as exc:
            raise CheckpointError(
                f"{path!r} is not a readable checkpoint: torch.load failed with {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}"
            ) from exc

    def __repr__(self) -> str:
        return f"TorchCheckpointIO(weights_only={self.weights_only})"


def _snapshot(obj: Any) -> Any:
    """A copy of ``obj`` whose tensors are detached CPU clones, so training can go on changing the originals."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, _snapshot(v)) for k, v in obj.items()) if type(obj) is not dict else {
            k: _snapshot(v) for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_snapshot(v) for v in obj]
    if isinstance(obj, tuple):
        items = [_snapshot(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return obj


class AsyncCheckpointIO(CheckpointIO):
    """Saves through another CheckpointIO in a background thread.

    The checkpoint is copied to CPU before ``save_checkpoint`` returns, so training can continue
    at once. The next save, a load, a removal and ``teardown`` wait for the save in flight; an
    error in the background is raised at the next of those calls (never lost).
    """

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        self.checkpoint_io = checkpoint_io if checkpoint_io is not None else TorchCheckpointIO()
        self._thread: threading.Thread | None = None
        self._error: tuple[str, BaseException] | None = None

    def _run(self, checkpoint: dict[str, Any], path: Any, storage_options: Any) -> None:
        try:
            save_with(self.checkpoint_io, checkpoint, path, storage_options)
        except BaseException as exc:  # surfaced by wait()
            self._error = (os.fspath(path), exc)

    def wait(self) -> None:
        """Block until the save in flight is written; re-raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            path, exc = self._error
            self._error = None
            raise CheckpointError(f"The background save of {path!r} failed: {type(exc).__name__}: {exc}") from exc

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        self.wait()
        snapshot = _snapshot(checkpoint)
        self._thread = threading.Thread(
            target=self._run, args=(snapshot, path, storage_options), name="torchfleet-async-checkpoint", daemon=False
        )
        self._thread.start()

    def load_checkpoint(self, path: Any, map_location: Any | None = None) -> dict[str, Any]:
        self.wait()
        return load_with(self.checkpoint_io, path, map_location)

    def remove_checkpoint(self, path: Any) -> None:
        self.wait()
        self.checkpoint_io.remove_checkpoint(path)

    def teardown(self) -> None:
        try:
            self.wait()
        finally:
            self.checkpoint_io.teardown()

    def __repr__(self) -> str:
        return f"AsyncCheckpointIO({self.checkpoint_io!r})"
