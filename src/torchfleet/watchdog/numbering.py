"""Collective numbering: each collective torchfleet issues gets this process's next number, a name and a call site.

``collective(name)`` wraps every collective torchfleet issues (ParallelStrategy's collectives, ``self.log``'s sync,
checkpoint barriers, backward's gradient sync, fsdp's forward all-gathers, the preemption agreement): it takes the
next sequence number, names it (``labelled`` adds what it is for) and records the user's call site and the Trainer's
loop position (``set_position``). Ranks that run the same program issue the same collectives in the same order, so
the same number names the same collective on every rank. Once the watchdog has started, each record is also written
to this rank's black box (blackbox.py).

A collective over a group of ranks (``collective(name, group=...)``: a mesh dimension, a process group; the text of
groups.py) is numbered within its group: tensor-parallel groups {0,1} and {2,3} that each run their own collectives,
as many as they like, stay in step with the world's numbering and with each other's.
"""

from __future__ import annotations

import mmap
import os
import time
import zlib
from typing import Any

from torchfleet.watchdog.blackbox import DONE, FAILED, IN, NOT_IN, STATES, write_record, write_state
from torchfleet.watchdog.sites import call_site


class _Recorder:
    """This process's collectives: the number of the last one begun, the current one, where the loops are."""

    __slots__ = ("seq", "name", "site", "where", "state", "started", "ended", "bounded", "box", "position",
                 "next_site", "label", "index", "world", "group", "counts")

    def __init__(self) -> None:
        #: the current or last collective's number: within its group (``group``), the world's when ``group`` is ""
        self.seq = 0
        #: how many collectives this process has begun, every group together (the black box's slots)
        self.index = 0
        #: how many collectives over every rank this process has begun
        self.world = 0
        #: the current or last collective's group (groups.py's text; "" for every rank)
        self.group = ""
        #: group text -> how many collectives over that group this process has begun
        self.counts: dict[str, int] = {}
        self.name = ""
        self.site = ""
        self.where = ""
        self.state = NOT_IN
        self.started = 0.0
        self.ended = 0.0
        self.bounded = True
        self.box: mmap.mmap | None = None
        #: where the Trainer's loops are, e.g. ("training", epoch, batch); None outside a batch
        self.position: tuple | None = None
        #: the call site the next collective reports instead of its own (self.log's line for its sync)
        self.next_site: str | None = None
        #: what the collectives issued now are for ("self.log 'loss' sync_dist"), set by ``labelled``
        self.label: str | None = None


_REC = _Recorder()


def set_position(position: tuple | None) -> None:
    """The Trainer's loops say where they are (stage, epoch, batch): shown in reports and part of the fingerprint."""
    _REC.position = position


class labelled:  # noqa: N801 - a context manager
    """``with labelled("self.log 'loss' sync_dist", site):`` names the collectives issued inside (and the first's site)."""

    __slots__ = ("previous",)

    def __init__(self, label: str | None, site: str | None = None) -> None:
        self.previous = _REC.label
        if label is not None:  # None keeps the label of an enclosing block
            _REC.label = label
        if site:
            _REC.next_site = site

    def __enter__(self) -> labelled:
        return self

    def __exit__(self, *exc: Any) -> None:
        _REC.label = self.previous
        _REC.next_site = None


def _describe_position(position: tuple | None) -> str:
    if position is None:
        return ""
    stage, epoch, batch = position
    at = ", epoch end" if batch == "end" else f" batch {batch}"  # "end": the epoch-end hooks and reductions
    return f"{stage} epoch {epoch}{at}" if epoch is not None else f"{stage}{at}"


class collective:  # noqa: N801 - used as a statement: ``with collective("barrier(save)"):``
    """Record one collective: ``with collective(name): dist.barrier()``.

    ``bounded=False``: a wait of unknown length (rank 0 downloading a data set) that the watchdog leaves alone.
    ``group``: the ranks it runs over (groups.group_text), numbered within that group; "" for every rank.
    """

    __slots__ = ("seq",)

    def __init__(self, name: str, site: str | None = None, bounded: bool = True, group: str = "") -> None:
        rec = _REC
        rec.index += 1
        if group:
            self.seq = rec.seq = rec.counts[group] = rec.counts.get(group, 0) + 1
        else:
            rec.world += 1
            self.seq = rec.seq = rec.world
        rec.group = group
        if rec.label is not None and "(" not in name:
            name = f"{name}({rec.label})"
        rec.name = name
        if site is None:
            site, rec.next_site = rec.next_site, None
        rec.site = site if site is not None else call_site()
        rec.where = _describe_position(rec.position)
        rec.bounded = bounded
        rec.started = time.monotonic()
        rec.state = IN
        if rec.box is not None:
            write_record(rec.box, rec.index, rec.seq, rec.state, rec.started, rec.ended, rec.name, rec.site, rec.where,
                         group)

    def __enter__(self) -> collective:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        rec = _REC
        rec.state = DONE if exc_type is None else FAILED
        rec.ended = time.monotonic()
        box = rec.box
        if box is not None:
            write_state(box, rec.index, rec.state, rec.started, rec.ended)

    def fingerprint(self) -> int:
        """A number in [1, 65536] that every rank computes alike for the same collective at the same point."""
        rec = _REC
        return (zlib.crc32(f"{self.seq}|{rec.name}|{rec.where}|{rec.group}".encode()) & 0xFFFF) + 1


def current() -> dict[str, Any]:
    """This process's record: the collective it is in, or the last it finished."""
    rec = _REC
    return {"seq": rec.seq, "state": STATES.get(rec.state, "none"), "name": rec.name, "site": rec.site,
            "where": rec.where, "group": rec.group, "started": rec.started, "ended": rec.ended, "pid": os.getpid(), "position": rec.position}


def attach_box(box: mmap.mmap) -> None:
    """Write this process's records into its black box from now on (the watchdog opens it when it starts)."""
    rec = _REC
    rec.box = box
    if rec.index:
        write_record(box, rec.index, rec.seq, rec.state, rec.started, rec.ended, rec.name, rec.site, rec.where,
                     rec.group)


def bounded_wait(now: float) -> float | None:
    """How long this process has waited in its current collective; None outside one, or in an unbounded one."""
    rec = _REC
    return now - rec.started if rec.state == IN and rec.bounded else None


def in_failed_collective() -> bool:
    """Whether this process's last collective raised (its peer aborted, the connection was reset)."""
    return _REC.state == FAILED
