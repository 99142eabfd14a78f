"""The report: what every rank was doing when a run hung or desynchronised, in the words a user acts on.

The launching process (launchers/supervise.py) calls ``report`` with the run's folder: each rank's current or last
collective from its black box, the analysis (desync.py), and the Python stacks of the ranks that are not waiting in a
collective. Under torchrun no process sees every box: each rank writes its own part (``own_part``) to its stderr.
"""

from __future__ import annotations

import faulthandler
import io
import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from torchfleet.watchdog.blackbox import box_path, read_box, stacks_path
from torchfleet.watchdog.desync import analyse
from torchfleet.watchdog.groups import over
from torchfleet.watchdog.nccl import dump_prefix
from torchfleet.watchdog.numbering import current


def describe_record(rank: int, rec: dict[str, Any] | None, timeout: float | None = None) -> str:
    """One line for a rank's record: the collective it waits in (and how long), failed in, or last finished."""
    if rec is None or not rec.get("seq"):
        return f"rank {rank}: no torchfleet collective yet"
    where = f", {rec['where']}" if rec.get("where") else ""
    at = f" called at {rec['site']}{where}"
    what = f"#{rec['seq']} {rec['name']}{over(rec.get('group') or '')}"
    if rec["state"] == "in":
        return f"rank {rank}: in {what} for {rec['waited']:.1f}s,{at}"
    verb = "failed in" if rec["state"] == "failed" else "not in a collective; its last was"
    return f"rank {rank}: {verb} {what},{at}"


def _indent(text: str, prefix: str = "    ") -> str:
    return "".join(prefix + line for line in text.splitlines(keepends=True))


def main_thread_stack(dump: str) -> str:
    """From a faulthandler dump of every thread, the blocks of threads not started by ``threading`` (the main one)."""
    blocks = [b for b in dump.split("\n\n") if b.strip()]
    main = [b for b in blocks if " in _bootstrap" not in b]
    return "\n\n".join(main or blocks) + "\n"


def report(folder: str, ranks: Iterator[int] | list[int], timeout: float | None = None,
           stacks_for: str = "outside") -> tuple[str, str]:
    """(kind, text): the collectives table of every rank whose black box is in ``folder``, its analysis, stacks.

    ``stacks_for``: "outside" shows the stacks of ranks that are not waiting in a collective, "all" every rank's.
    """
    now = time.monotonic()
    records = {r: read_box(box_path(folder, r), now) for r in ranks}
    if not any(records.values()):
        return "", ""
    kind, analysis = analyse(records)
    lines = ["Collectives (torchfleet numbers each collective it issues; the same number is the same collective "
             "on every rank, or on every rank of the group a collective runs over):"]
    lines += ["  " + describe_record(r, rec, timeout) for r, rec in sorted(records.items())]
    lines += analysis
    if kind == "hang" and timeout:
        lines.append(f"(hang_timeout={timeout:g}s; raise it on Trainer/Fleet if this wait was legitimate, e.g. rank 0 "
                     "writing a large checkpoint, or pass hang_timeout=None to switch the watchdog off.)")
    for r, rec in sorted(records.items()):
        if stacks_for == "all" or rec is None or rec["state"] == "done":
            text = ""
            for path in (stacks_path(folder, r), stacks_path(folder, r) + ".fatal"):
                try:
                    with open(path) as f:
                        text = main_thread_stack(f.read()) if os.path.getsize(path) else ""
                except OSError:
                    continue
                if text.strip():
                    break
            if not text.strip():
                continue
            lines.append(f"Python stack of rank {r} (main thread):")
            lines.append(_indent(text).rstrip("\n"))
    prefix = dump_prefix()
    if prefix and os.environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT"):
        lines.append(f"NCCL flight recorder dumps (nccl runs): {prefix}<rank>")
    return kind, "\n".join(lines)


def own_part(rank: int, world_size: int, folder: str, why: str, *, timeout: float | None = None,
             peers: dict[int, dict[str, Any]] | None = None, nccl: str | None = None,
             nccl_prefix: str | None = None) -> str:
    """Under torchrun, where no launching process reports: this rank's part of the report, for its stderr.

    ``peers``: the other ranks' records when this rank compared them (a desync); ``nccl``: this rank's flight recorder
    dump, ``nccl_prefix``: where the ranks' dumps go.
    """
    rec = read_box(box_path(folder, rank)) or current()
    buf = io.StringIO()
    lines = [f"torchfleet: rank {rank} of {world_size} {why}.", "  " + describe_record(rank, rec, timeout)]
    if peers:
        lines += ["  " + describe_record(r, rec) for r, rec in sorted(peers.items()) if r != rank]
        lines += ["  " + line for line in analyse(peers)[1]]
    if nccl:
        lines.append(f"  NCCL flight recorder dump: {nccl}")
    elif nccl_prefix:
        lines.append(f"  NCCL flight recorder dumps: {nccl_prefix}<rank>")
    lines.append(f"  Python stacks of rank {rank}:")
    buf.write("\n".join(lines) + "\n")
    tmp = tempfile.TemporaryFile("w+")
    faulthandler.dump_traceback(file=tmp, all_threads=True)
    tmp.seek(0)
    buf.write(_indent(tmp.read()))
    return buf.getvalue()
