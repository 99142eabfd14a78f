"""The black box: a rank's collectives record in a small file of its own (a memory map), readable whatever killed it.

Writing costs about a microsecond per collective, and the file survives the process (a gloo abort, SIGKILL), so the
launching process reads every rank's box (``read_box``) for its report. Layout: a header (magic, pid, the index of
the current or last collective among all this process began, its state, when it started and ended), then the last
``_SLOTS`` collectives, slot ``index % _SLOTS``: the index, the collective's number (within its group: numbering.py),
then ``group\\0name\\0site\\0where``; so the report can compare the ranks at the first number where they differ
even when one rank has run past it. ``history`` keys a collective over every rank by its number, one over a group by
``(group, number)`` (groups.py's text).
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from typing import Any

BOX_SIZE = 4096
_HEADER = struct.Struct("<4sqqbdd")  # magic, pid, index, state, started, ended
_SLOT_START, _SLOT_SIZE, _SLOTS = 128, 248, 16
_SLOT_SEQ = struct.Struct("<qq")  # index, number
_MAGIC = b"TFWD"
#: a collective's state: none yet, waiting in it, finished, raised
NOT_IN, IN, DONE, FAILED = 0, 1, 2, 3
STATES = {IN: "in", DONE: "done", FAILED: "failed"}


def box_path(folder: str, rank: int) -> str:
    """Rank ``rank``'s black box in the run's folder."""
    return os.path.join(folder, f"collectives-{rank}.bin")


def stacks_path(folder: str, rank: int) -> str:
    """Where rank ``rank`` writes its Python stacks (faulthandler) when it or the launching process asks."""
    return os.path.join(folder, f"stacks-{rank}.txt")


def open_box(folder: str, rank: int) -> mmap.mmap:
    """Create rank ``rank``'s black box in ``folder``, empty, and map it for writing."""
    path = box_path(folder, rank)
    with open(path, "wb") as f:
        f.write(b"\0" * BOX_SIZE)
    with open(path, "r+b") as f:
        return mmap.mmap(f.fileno(), BOX_SIZE)


def write_record(box: mmap.mmap, index: int, seq: int, state: int, started: float, ended: float, name: str, site: str,
                 where: str, group: str = "") -> None:
    """Collective ``index`` (number ``seq`` in ``group``) into its slot, and the header: it is the current one."""
    text = f"{group}\0{name}\0{site}\0{where}".encode(errors="replace")[: _SLOT_SIZE - _SLOT_SEQ.size - 2]
    start = _SLOT_START + (index % _SLOTS) * _SLOT_SIZE
    _SLOT_SEQ.pack_into(box, start, index, seq)
    box[start + _SLOT_SEQ.size:start + _SLOT_SEQ.size + len(text) + 2] = text + b"\0\0"
    write_state(box, index, state, started, ended)


def write_state(box: mmap.mmap, index: int, state: int, started: float, ended: float) -> None:
    """The header alone: the current collective's state changed (it finished or raised)."""
    _HEADER.pack_into(box, 0, _MAGIC, os.getpid(), index, state, started, ended)


def read_box(path: str, now: float | None = None) -> dict[str, Any] | None:
    """A rank's last record from its black box; None when there is none."""
    try:
        with open(path, "rb") as f:
            data = f.read(BOX_SIZE)
    except OSError:
        return None
    if len(data) < _HEADER.size or data[:4] != _MAGIC:
        return None
    _, pid, index, state, started, ended = _HEADER.unpack_from(data, 0)
    history: dict[Any, tuple[str, str, str]] = {}
    seq, name, site, where, group = 0, "", "", "", ""
    for slot in range(_SLOTS):
        start = _SLOT_START + slot * _SLOT_SIZE
        number, n = _SLOT_SEQ.unpack_from(data, start)
        if number > 0:
            text = data[start + _SLOT_SEQ.size:start + _SLOT_SIZE].split(b"\0\0", 1)[0].decode(errors="replace")
            g, nm, st, wh = (text.split("\0") + ["", "", "", ""])[:4]
            history[(g, n) if g else n] = (nm, st, wh)
            if number == index:
                seq, name, site, where, group = n, nm, st, wh, g
    now = time.monotonic() if now is None else now
    return {"seq": seq, "state": STATES.get(state, "none"), "name": name, "site": site, "where": where,
            "group": group, "pid": pid, "waited": (now - started) if state == IN else (ended - started),
            "history": history}


def read_boxes(folder: str) -> dict[int, dict[str, Any] | None]:
    """Every rank's last record from the black boxes in ``folder`` (rank -> record)."""
    records = {}
    for entry in os.listdir(folder):
        if entry.startswith("collectives-") and entry.endswith(".bin"):
            records[int(entry[len("collectives-"):-len(".bin")])] = read_box(os.path.join(folder, entry))
    return records
