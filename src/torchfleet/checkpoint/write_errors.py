"""A save that failed for want of room (a full disk, a quota, a file-size limit), said as one paragraph.

DCP gathers every rank's write error into one ``CheckpointException`` whose text is each rank's raw traceback, and
torch's zip writer turns a short write into ``unexpected pos 704 vs 598`` without the OS's reason: ``no_room`` finds
the reason among the ranks' errors (or, where only the zip writer's words are left, in the file system's free space
and this process's file-size limit) and names the checkpoint's path.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Mapping

from torchfleet.errors import CheckpointError

#: errno -> (the OS's words, what to do)
_NO_ROOM = {
    errno.ENOSPC: ("No space left on device", "the file system holding it is full: free space there, or save "
                   "somewhere else (ModelCheckpoint(dirpath=...), trainer.save_checkpoint(path))"),
    errno.EDQUOT: ("Disk quota exceeded", "your quota on that file system is used up: free space, or save somewhere "
                   "else"),
    errno.EFBIG: ("File too large", "a shard is larger than this process may write (the file-size limit: ulimit -f, "
                  "RLIMIT_FSIZE) or than the file system allows: raise the limit, or save somewhere else"),
}
#: what torch's zip writer says when the OS wrote fewer bytes than it was given
_SHORT_WRITE = "unexpected pos"
#: below this much free space a short write is taken for a full file system
_FULL_BELOW = 1 << 20


def _errors(exc: BaseException) -> Iterator[tuple[int | None, BaseException]]:
    """(rank, error) for every error ``exc`` holds: a CheckpointException's ranks' errors, and their causes."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, Mapping) and failures:
        pairs = [(r, f[0] if isinstance(f, tuple) else f) for r, f in sorted(failures.items())]
    else:
        pairs = [(None, exc)]
    for rank, error in pairs:
        seen = set()
        while isinstance(error, BaseException) and id(error) not in seen:
            seen.add(id(error))
            yield rank, error
            error = error.__cause__ or error.__context__


def _from_the_file_system(folder: str) -> int | None:
    """The errno a write that was cut short without one most likely met: a full file system, else the size limit."""
    try:
        stat = os.statvfs(folder)
        if stat.f_bavail * stat.f_frsize < _FULL_BELOW:
            return errno.ENOSPC
    except OSError:
        pass
    try:
        import resource

        if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
            return errno.EFBIG
    except (ImportError, OSError, ValueError):
        pass
    return None


def no_room(path: str | os.PathLike, exc: BaseException) -> CheckpointError | None:
    """The CheckpointError for a save of ``path`` that ``exc`` ended for want of room; None for any other failure."""
    path = os.path.abspath(os.fspath(path))
    found = [(rank, e) for rank, e in _errors(exc) if isinstance(e, OSError) and e.errno in _NO_ROOM]
    if found:
        rank, error = found[0]
        code, file = error.errno, error.filename
    elif any(_SHORT_WRITE in str(e) for _, e in _errors(exc)):
        code, file = _from_the_file_system(os.path.dirname(path)), None
        rank = next(r for r, e in _errors(exc) if _SHORT_WRITE in str(e))
        if code is None:
            return None
    else:
        return None
    words, advice = _NO_ROOM[code]
    ranks = sorted({r for r, e in found if r is not None}) if found else ([rank] if rank is not None else [])
    who = f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}" if ranks else ""
    where = f" writing {file}" if file else ""
    return CheckpointError(
        f"Saving the checkpoint {path!r} failed: {words} ({errno.errorcode[code]}{who}{where}): {advice}. The "
        "checkpoint was not written; the previous one at that path, if any, is unchanged."
    )
