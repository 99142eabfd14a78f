"""CheckpointIO: how checkpoint dicts reach storage. Atomic local files by default; async on request."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
import logging
import os
import re
import shutil
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch

from torchfleet.checkpoint import safe
from torchfleet.errors import CheckpointError

log = logging.getLogger(__name__)

#: file suffixes listed as candidates when a checkpoint path does not exist
CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth")


class CheckpointIO(ABC):
    """Saves and loads checkpoint dicts. Subclass it to store checkpoints elsewhere (object stores, ...).

    Subclasses implement the two abstract methods with their declared signatures: torchfleet calls
    ``save_checkpoint(checkpoint, path, storage_options=...)`` and ``load_checkpoint(path, map_location=...)``,
    adding ``weights_only=`` only when the user gave it (``fit(..., weights_only=False)``), so an
    implementation without that argument keeps working until someone asks for it.
    """

    #: whether loads refuse pickled code (torch.load(weights_only=True)); the strategy's readers of sharded
    #: checkpoint directories follow it too. False trusts every file the run loads.
    weights_only: bool = True

    @abstractmethod
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path``."""

    @abstractmethod
    def load_checkpoint(
        self, path: str | os.PathLike, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Read the checkpoint at ``path`` (``weights_only``: None means this CheckpointIO's own setting)."""

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        """Delete the checkpoint at ``path`` (a file or a directory); a missing path is not an error."""
        path = os.fspath(path)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

    def teardown(self) -> None:
        """Finish pending work and release resources."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


_save_counter = itertools.count()
#: ``.<name>.tmp-<pid>[-<count>][@<host>]``; names without a host come from older torchfleet versions (taken as this machine's)
_TEMP = re.compile(r"^\..+\.tmp-(?P<pid>\d+)(-\d+)?(@(?P<host>[A-Za-z0-9_.-]+))?$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "localhost"


def temp_name(path: str | os.PathLike) -> str:
    """Where a save writes before the rename: beside the target, hidden, marked with the writer's pid, a count and
    its machine (so a later save can tell a crashed writer's leftover from a live one)."""
    head, tail = os.path.split(os.fspath(path))
    return os.path.join(head, f".{tail}.tmp-{os.getpid()}-{next(_save_counter)}@{_host()}")


def is_temp_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a temporary file of an unfinished (or crashed) save, never a checkpoint."""
    return bool(_TEMP.match(os.path.basename(os.fspath(path))))


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: the existence check, nothing is delivered
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive under another user
        return True
    return True


def remove_stale_temp_files(directory: str | os.PathLike) -> list[str]:
    """Delete the temporary files in ``directory`` left by saves whose process died (killed mid-save); return them.

    Only files written on this machine by a process that no longer exists are removed: a save still
    running (in this or another process, or on another machine sharing the folder) keeps its file.
    """
    if os.name == "nt":  # os.kill(pid, 0) is not an existence check there
        return []
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    host = _host()
    for entry in entries:
        match = _TEMP.match(entry.name)
        if match is None or match.group("host") not in (None, host) or _process_alive(int(match.group("pid"))):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                os.remove(entry.path)
                removed.append(entry.path)
        except OSError:  # removed meanwhile by another cleaner, or not ours to remove
            continue
    if removed:
        log.info("Removed %d temporary file(s) of interrupted saves in %s.", len(removed), os.fspath(directory))
    return removed


def _fsync_dir(directory: str) -> None:
    # makes the rename itself durable; some platforms and filesystems cannot open or sync directories
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


def _checkpoints_in(directory: str, limit: int = 5) -> list[str]:
    """Up to ``limit`` checkpoint-looking file names in ``directory``, newest first."""
    try:
        entries = [e for e in os.scandir(directory) if e.is_file() and e.name.endswith(CHECKPOINT_SUFFIXES)
                   and not e.name.startswith(".")]
    except OSError:
        return []
    entries.sort(key=lambda e: e.stat().st_mtime, reverse=True)
    return [e.name for e in entries[:limit]]


def _missing(path: str) -> CheckpointError:
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(parent):
        near = _checkpoints_in(parent)
        listing = (f" Checkpoint files in {parent}: {', '.join(near)}." if near
                   else f" {parent} holds no checkpoint files ({', '.join(CHECKPOINT_SUFFIXES)}).")
    else:
        listing = f" Its directory {parent} does not exist either."
    return CheckpointError(f"No checkpoint at {path!r}: the path does not exist.{listing}")


class TorchCheckpointIO(CheckpointIO):
    """``torch.save``/``torch.load`` on local files, written atomically.

    The checkpoint goes to a hidden temporary file beside the target, is flushed and fsynced, then
    renamed over the target: a crash mid-save leaves the previous file intact (and the next save in
    that folder removes what it left). Loading runs no code from the file (``weights_only=True``,
    see torchfleet.checkpoint.safe): everything torchfleet writes loads that way.
    ``TorchCheckpointIO(weights_only=False)`` unpickles anything, for a run whose files you trust.
    """

    def __init__(self, weights_only: bool = True) -> None:
        self.weights_only = weights_only

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path`` atomically, creating parent directories."""
        if storage_options is not None:
            raise TypeError(
                f"TorchCheckpointIO.save_checkpoint takes no storage_options (got {storage_options!r}); pass a "
                "custom CheckpointIO that uses them."
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
            try:
                os.remove(tmp)
            except FileNotFoundError:
                pass
            raise
        _fsync_dir(directory)
        remove_stale_temp_files(directory)

    def load_checkpoint(
        self, path: str | os.PathLike, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Read the checkpoint at ``path``; a missing, unreadable or (loading safely) unsafe file raises CheckpointError."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise _missing(path)
        if os.path.isdir(path):
            raise CheckpointError(
                f"{path!r} is a directory; TorchCheckpointIO reads checkpoint files. A sharded (directory) checkpoint "
                "is read by the strategy that wrote it."
            )
        if os.path.getsize(path) == 0:
            raise CheckpointError(f"{path!r} is not a readable checkpoint: the file is empty.")
        try:
            # map_location None: onto the CPU (Lightning's default, ``lambda storage, loc: storage``), whatever device
            # the tensors were saved from
            return safe.load(path, map_location="cpu" if map_location is None else map_location,
                             weights_only=self.weights_only if weights_only is None else weights_only)
        except CheckpointError:
            raise
        except Exception as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise CheckpointError(
                f"{path!r} is not a readable checkpoint: torch.load failed with {type(exc).__name__}: {first_line}."
            ) from None

    def __repr__(self) -> str:
        return f"TorchCheckpointIO(weights_only={self.weights_only})"


_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size)


def _snapshot(obj: Any, memo: dict[int, Any] | None = None) -> Any:
    """A copy of ``obj`` whose tensors are detached CPU clones, so training can go on changing the originals.

    A tensor met twice (tied weights) is cloned once, so the copy keeps the sharing.
    """
    if memo is None:
        memo = {}
    if isinstance(obj, _IMMUTABLE):
        return obj
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, torch.Tensor):
        out: Any = obj.detach().to("cpu", copy=True)
    elif isinstance(obj, Mapping):
        items = {k: _snapshot(v, memo) for k, v in obj.items()}
        if type(obj) is dict:
            out = items
        else:
            try:  # OrderedDict, defaultdict, ...: keep the type and its extra state
                out = copy.copy(obj)
                out.update(items)
            except (TypeError, AttributeError):
                out = items
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        out = type(obj)(*[_snapshot(v, memo) for v in obj])
    elif isinstance(obj, (list, tuple, set, frozenset)):
        out = type(obj)(_snapshot(v, memo) for v in obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = copy.copy(obj)
        for field in dataclasses.fields(obj):
            object.__setattr__(out, field.name, _snapshot(getattr(obj, field.name), memo))
    else:
        try:  # other objects (hyperparameter namespaces, ...) may be mutated by training too
            out = copy.deepcopy(obj)
        except Exception:
            out = obj
    memo[id(obj)] = out
    return out


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
        self._lock = threading.Lock()

    @property
    def weights_only(self) -> bool:  # type: ignore[override]
        """The wrapped CheckpointIO's setting."""
        return self.checkpoint_io.weights_only

    def _run(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any) -> None:
        try:
            self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)
        except BaseException as exc:  # kept for wait(); logged now in case the program ends first
            log.error("Background save of %r failed: %s: %s", os.fspath(path), type(exc).__name__, exc)
            self._error = (os.fspath(path), exc)

    def _wait(self) -> None:
        # callers hold self._lock
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            path, exc = self._error
            self._error = None
            raise CheckpointError(f"The background save of {path!r} failed: {type(exc).__name__}: {exc}") from exc

    def wait(self) -> None:
        """Block until the save in flight is written; re-raise its error (as CheckpointError) if it failed."""
        with self._lock:
            self._wait()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any | None = None
    ) -> None:
        """Snapshot ``checkpoint`` to CPU now and write it in the background."""
        with self._lock:
            self._wait()
            snapshot = _snapshot(checkpoint)
            # not a daemon: the interpreter lets a started save finish before it exits
            self._thread = threading.Thread(
                target=self._run, args=(snapshot, path, storage_options), name="torchfleet-async-checkpoint"
            )
            self._thread.start()

    def load_checkpoint(
        self, path: str | os.PathLike, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Wait for the save in flight, then load through the wrapped CheckpointIO."""
        self.wait()
        return load_through(self.checkpoint_io, path, map_location, weights_only)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        """Wait for the save in flight (it may be writing ``path``), then remove ``path``."""
        self.wait()
        self.checkpoint_io.remove_checkpoint(path)

    def teardown(self) -> None:
        """Wait for the save in flight, raise its error if it failed, and tear down the wrapped CheckpointIO."""
        try:
            self.wait()
        finally:
            self.checkpoint_io.teardown()

    def __repr__(self) -> str:
        return f"AsyncCheckpointIO({self.checkpoint_io!r})"


def load_through(io: CheckpointIO, path: str | os.PathLike, map_location: Any = None,
                 weights_only: bool | None = None) -> dict[str, Any]:
    """``io.load_checkpoint(path, weights_only=...)`` as Lightning's strategies call it (``map_location=`` only when
    given: the default loads onto the CPU).

    A CheckpointIO written without ``weights_only`` (Lightning's older signature, or ``(path, map_location)``)
    still loads when none was asked for; asked for a setting it cannot take, it gets a clear error.
    """
    kwargs = {} if map_location is None else {"map_location": map_location}
    if _takes(io.load_checkpoint, "weights_only"):
        return io.load_checkpoint(path, **kwargs, weights_only=weights_only)
    if weights_only is None:
        return io.load_checkpoint(path, **kwargs)
    raise CheckpointError(
        f"weights_only={weights_only} was asked for, but {type(io).__name__}.load_checkpoint takes no weights_only "
        "argument. Add `weights_only: bool | None = None` to it (None: its own setting), or load without "
        "weights_only."
    )


def _takes(fn: Any, name: str) -> bool:
    """Whether ``fn`` accepts the keyword ``name`` (a callable whose signature cannot be read is assumed to)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())
