"""The on-disk layout of sharded checkpoints, shared by every sharded strategy, and their atomic saving.

A sharded checkpoint is a directory at the path the user gave (``epoch=1-step=40.ckpt/``):

* ``torchfleet.pt`` (``META_NAME``): a torch.save'd dict with everything that is not sharded, the
  same keys as a single-file checkpoint (epoch, global_step, loops, callbacks, lr_schedulers, rng,
  ...) minus the sharded entries, and the format marker under ``"torchfleet"``:
  ``{"version": ..., "format": 2, "layout": "dcp" | "deepspeed"}``. It is written last, so a
  directory without it is an unfinished save.
* layout ``"dcp"``: torch.distributed.checkpoint files (``.metadata``, ``__<rank>_0.distcp``) with the
  sharded entries (``"state_dict"``, ``"optimizer_states"``), keyed by the user's parameter names,
  which any world size and any strategy can read (see ``torchfleet.checkpoint.dcp``).
* layout ``"deepspeed"``: DeepSpeed's own engine checkpoint under ``deepspeed/``.

Saving goes through ``atomic_checkpoint_dir``: every rank writes into a hidden ``.<name>.partial``
directory beside the target, which replaces the target only once complete. A crash or a killed
process mid-save leaves the previous checkpoint at the path as it was.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import torch

from torchfleet.checkpoint import safe
from torchfleet.checkpoint.io import _fsync_dir
from torchfleet.checkpoint.schema import FORMAT_KEY
from torchfleet.errors import CheckpointError

log = logging.getLogger(__name__)


class Ranks(Protocol):
    """What a sharded save needs of the processes writing it (every Strategy is one): who is rank 0, and a barrier."""

    @property
    def is_global_zero(self) -> bool: ...

    def barrier(self, name: str | None = None) -> None: ...

#: the file inside a sharded checkpoint directory that holds everything not sharded (written last)
META_NAME = "torchfleet.pt"
#: the ``"format"`` value of sharded checkpoints (single files are format 1)
SHARDED_FORMAT = 2
#: the layouts a sharded checkpoint directory can have
LAYOUTS = ("dcp", "deepspeed")

_PARTIAL_SUFFIX = ".partial"
_OLD_SUFFIX = ".old"


def sharded_marker(layout: str) -> dict[str, Any]:
    """The format marker (the value under ``"torchfleet"``) of a sharded checkpoint with ``layout``."""
    import torchfleet

    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not a sharded checkpoint layout; accepted: {', '.join(LAYOUTS)}")
    return {"version": torchfleet.__version__, "format": SHARDED_FORMAT, "layout": layout}


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a complete sharded checkpoint: a directory holding ``META_NAME``."""
    path = os.fspath(path)
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, META_NAME))


def _describe_foreign(path: str) -> str:
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        return f"it cannot be listed ({exc.strerror})"
    if not names:
        return "it is empty"
    if ".metadata" in names or any(n.endswith(".distcp") for n in names):
        return (f"it holds torch.distributed.checkpoint files ({', '.join(names[:4])}"
                f"{', ...' if len(names) > 4 else ''}) but no {META_NAME}: either a save that was interrupted before "
                "it finished, or a DCP checkpoint written by another tool")
    return f"it holds {', '.join(names[:5])}{', ...' if len(names) > 5 else ''} but no {META_NAME}"


def checkpoint_layout(path: str | os.PathLike, weights_only: bool = True) -> str:
    """The layout ("dcp" or "deepspeed") of the sharded checkpoint directory at ``path`` (``weights_only``: see read_meta).

    Raises CheckpointError for a path that is not a directory, a directory without ``META_NAME``
    (an unfinished save or another tool's files) or a marker naming an unknown layout.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        what = "a file" if os.path.exists(path) else "missing"
        raise CheckpointError(
            f"{path!r} is not a sharded checkpoint directory: the path is {what}. Sharded strategies (fsdp, deepspeed) "
            "save checkpoints as directories; single-file checkpoints load with every strategy as they are."
        )
    if not os.path.isfile(os.path.join(path, META_NAME)):
        raise CheckpointError(
            f"{path!r} is not a complete torchfleet sharded checkpoint: {_describe_foreign(path)}. torchfleet writes "
            f"{META_NAME} last, so a directory without it never finished saving; resume from an earlier checkpoint "
            "(ModelCheckpoint's last.ckpt still points at the last complete one)."
        )
    marker = read_meta(path, weights_only).get(FORMAT_KEY)
    layout = marker.get("layout") if isinstance(marker, Mapping) else None
    if layout not in LAYOUTS:
        raise CheckpointError(
            f"{path!r} has a {META_NAME} whose format marker ({FORMAT_KEY!r}: {marker!r}) names no known layout. "
            f"Accepted layouts are {', '.join(map(repr, LAYOUTS))}; the checkpoint may come from a newer torchfleet."
        )
    return layout


def write_meta(directory: str | os.PathLike, meta: Mapping[str, Any]) -> None:
    """Write ``meta`` as ``META_NAME`` into ``directory`` (call it on rank 0 only, after the sharded files).

    ``meta[FORMAT_KEY]`` must be a marker naming the layout (see ``sharded_marker``). The file is
    written under a temporary name, fsynced and renamed, so it exists only once complete.
    """
    marker = meta.get(FORMAT_KEY)
    if not isinstance(marker, Mapping) or marker.get("layout") not in LAYOUTS:
        raise ValueError(
            f"write_meta needs meta[{FORMAT_KEY!r}] to be a marker with a 'layout' in {LAYOUTS} (see sharded_marker); "
            f"got {marker!r}"
        )
    directory = os.fspath(directory)
    target = os.path.join(directory, META_NAME)
    tmp = os.path.join(directory, f".{META_NAME}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(dict(meta), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    _fsync_dir(directory)


def read_meta(path: str | os.PathLike, weights_only: bool = True) -> dict[str, Any]:
    """The dict stored as ``META_NAME`` in the sharded checkpoint directory ``path``.

    Read without running code from it; ``weights_only=False`` unpickles anything (a file you trust).
    """
    file = os.path.join(os.fspath(path), META_NAME)
    if not os.path.isfile(file):
        raise CheckpointError(
            f"{os.fspath(path)!r} has no {META_NAME}, so it is not a complete torchfleet sharded checkpoint: "
            f"{_describe_foreign(os.fspath(path)) if os.path.isdir(path) else 'the directory does not exist'}."
        )
    try:
        meta = safe.load(file, weights_only=weights_only)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"{file!r} cannot be read ({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}): "
            "the checkpoint directory is damaged. Resume from another checkpoint."
        ) from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{file!r} holds a {type(meta).__name__}, not the dict torchfleet writes there.")
    return meta


# ---------------------------------------------------------------------------- atomic directory
def partial_dir(path: str | os.PathLike) -> str:
    """Where a save of ``path`` writes before it is moved into place: ``<parent>/.<name>.partial``."""
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(parent, f".{name}{_PARTIAL_SUFFIX}")


def _aside_dir(path: str) -> str:
    parent, name = os.path.split(path)
    return os.path.join(parent, f".{name}{_OLD_SUFFIX}")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Swap the entries ``a`` and ``b`` in one atomic step (Linux renameat2); False where that is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False  # kernel or filesystem without the flag: fall back to two renames
    raise OSError(code, f"renameat2({a!r}, {b!r}, RENAME_EXCHANGE) failed: {os.strerror(code)}")


def _move_into_place(finished: str, path: str) -> None:
    """Replace whatever is at ``path`` by the directory ``finished``; the old entry is deleted only afterwards."""
    if not os.path.lexists(path):
        os.rename(finished, path)
    elif _exchange(finished, path):
        _remove(finished)  # now holds the previous checkpoint
    else:
        # without an atomic swap there is a moment between the two renames where only the aside copy
        # exists; _recover puts it back if a crash lands exactly there
        aside = _aside_dir(path)
        _remove(aside)
        os.rename(path, aside)
        os.rename(finished, path)
        _remove(aside)
    _fsync_dir(os.path.dirname(path))


def _recover(path: str) -> None:
    """Put back a previous checkpoint left aside by a save that crashed between its two renames."""
    aside = _aside_dir(path)
    if os.path.lexists(aside):
        if not os.path.lexists(path):
            os.rename(aside, path)
            log.warning("Restored %s from %s, left by a save that was interrupted.", path, aside)
        else:
            _remove(aside)


@contextlib.contextmanager
def atomic_checkpoint_dir(path: str | os.PathLike, ranks: Ranks) -> Iterator[str]:
    """Every rank enters; yields the temporary directory every rank writes into (the same path on all ranks).

    Rank 0 creates ``<parent>/.<name>.partial`` (removing a leftover of a crashed save), then all ranks
    meet at a barrier. On normal exit: barrier, rank 0 moves the finished directory to ``path``
    (an existing checkpoint there is replaced only now: swapped atomically where the OS can,
    otherwise renamed aside, the new one renamed in, the old deleted) and fsyncs the parent, barrier.
    On an exception the previous checkpoint at ``path`` is untouched, and rank 0 removes the partial
    directory if it raised itself. Across machines ``path`` must be on a filesystem all ranks share.
    """
    target = os.path.abspath(os.fspath(path))
    tmp = partial_dir(target)
    if ranks.is_global_zero:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _recover(target)
        _remove(tmp)
        os.makedirs(tmp)
    ranks.barrier("sharded_checkpoint_start")
    try:
        yield tmp
    except BaseException:
        if ranks.is_global_zero:
            _remove(tmp)
        raise
    ranks.barrier("sharded_checkpoint_written")
    if ranks.is_global_zero:
        if not os.path.isfile(os.path.join(tmp, META_NAME)):
            _remove(tmp)
            raise CheckpointError(
                f"The sharded save of {target!r} finished without writing {META_NAME}; the checkpoint was discarded "
                "and the previous one (if any) kept. The strategy that saved it must call write_meta on rank 0."
            )
        _move_into_place(tmp, target)
    ranks.barrier("sharded_checkpoint_done")

