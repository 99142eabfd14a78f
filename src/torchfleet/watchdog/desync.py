"""Comparing the ranks' records: the first collective they disagree on (a desync), or the one they all wait in (a hang).

``analyse`` explains a set of records (from the black boxes, or from the rendezvous store under torchrun) in
lines that name both call sites. While a rank waits, its watchdog compares its record with the other ranks'
(``local_desync``: the boxes beside its own; ``store_desync``: the store), so a desync is reported after seconds
instead of after ``hang_timeout``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from torchfleet.watchdog.blackbox import read_boxes
from torchfleet.watchdog.numbering import current


def analyse(records: dict[int, dict[str, Any] | None]) -> tuple[str, list[str]]:
    """(kind, lines): kind is "desync", "hang" or ""; lines explain it, naming the call sites."""
    known = {r: rec for r, rec in records.items() if rec is not None and rec.get("seq")}
    if len(known) < 2:
        return "", []
    # the first number at which two ranks' recent collectives differ (name or place in the loop)
    common = sorted(set.union(*(set(rec.get("history") or {}) for rec in known.values())))
    for seq in common:
        seen = {r: rec["history"][seq] for r, rec in known.items() if seq in (rec.get("history") or {})}
        if len(seen) > 1 and len({(n, w) for n, _, w in seen.values()}) > 1:
            a = next(iter(seen))
            b = next(r for r in seen if (seen[r][0], seen[r][2]) != (seen[a][0], seen[a][2]))
            (na, sa, wa), (nb, sb, wb) = seen[a], seen[b]
            return _desync(known, (
                f"Desync: the ranks called different collectives as #{seq}: rank {a} {na} at {sa}"
                f"{f' ({wa})' if wa else ''}, rank {b} {nb} at {sb}{f' ({wb})' if wb else ''}."
            ))
    by_seq: dict[int, list[int]] = {}
    for r, rec in known.items():
        by_seq.setdefault(rec["seq"], []).append(r)
    # the same number, different collectives: the ranks left the common order before this one
    for seq, ranks in sorted(by_seq.items()):
        names = {known[r]["name"] for r in ranks}
        if len(names) > 1:
            a, b = ranks[0], next(r for r in ranks if known[r]["name"] != known[ranks[0]]["name"])
            return _desync(known, (
                f"Desync: the ranks called different collectives as #{seq}: rank {a} {known[a]['name']} at "
                f"{known[a]['site']}{_at(known[a])}, rank {b} {known[b]['name']} at {known[b]['site']}{_at(known[b])}."
            ))
    waiting = {r: rec for r, rec in known.items() if rec["state"] == "in"}
    if len(by_seq) > 1:
        top = max(by_seq)
        ahead = by_seq[top]
        behind = sorted(r for r in known if known[r]["seq"] < top)
        behind_waiting = [r for r in behind if r in waiting]
        a = ahead[0]
        if behind_waiting:
            b = behind_waiting[0]
            return _desync(known, (
                f"Desync: rank {a} is in #{top} {known[a]['name']} (called at {known[a]['site']}{_at(known[a])}) "
                f"while rank {b} waits in #{known[b]['seq']} {known[b]['name']} (called at {known[b]['site']}"
                f"{_at(known[b])}): the ranks issued different numbers of collectives."
            ))
        b = behind[0]
        return "hang", [
            f"Hang: rank {a} waits in #{top} {known[a]['name']} (called at {known[a]['site']}{_at(known[a])}), "
            f"which rank{'s' if len(behind) > 1 else ''} {', '.join(map(str, behind))} never reached: rank {b}'s "
            f"last collective was #{known[b]['seq']} {known[b]['name']} (called at {known[b]['site']}{_at(known[b])}); "
            "it is still in its own code or in a collective torchfleet does not see (its stack is below), or it "
            "skipped this collective (code that runs on some ranks only)."
        ]
    if len(waiting) == len(known):
        seq = next(iter(by_seq))
        return "hang", [f"Hang: every rank waits in the same collective #{seq} {known[next(iter(known))]['name']}: "
                        "the collective itself does not complete (network, or a process outside this run)."]
    return "", []


_DESYNC_HINT = ("This is a control-flow divergence inside the run (the ranks took different paths through the "
                "program), not a network problem. Every rank must issue the same collectives in the same order: look "
                "for code that runs on some ranks only (if self.global_rank == ..., a self.log(sync_dist=True) or "
                "all_gather under a condition that differs between ranks, data of different lengths per rank; "
                "evaluation shards are exact, so ranks may run different numbers of validation/test/predict batches "
                "and a collective of your own in validation_step has no partner on a rank that ran out).")


def _desync(known: dict[int, dict[str, Any]], first: str) -> tuple[str, list[str]]:
    """("desync", lines): ``first``, where each rank's loops were at its latest collective (the Trainer's stage,
    epoch and batch; left out when no rank is in a Trainer loop, as in a Fleet loop), then the hint."""
    lines = [first]
    if any(rec.get("where") for rec in known.values()):
        lines.append("Loop positions: " + "; ".join(
            f"rank {r} {rec.get('where') or 'outside the Trainer loops'} (#{rec['seq']})"
            for r, rec in sorted(known.items())) + ".")
    return "desync", [*lines, _DESYNC_HINT]


def _at(rec: dict[str, Any]) -> str:
    return f" ({rec['where']})" if rec.get("where") else ""


def local_desync(folder: str, threshold: float) -> bool:
    """Whether the ranks whose black boxes are in ``folder``, each waiting longer than ``threshold`` seconds, wait in
    different collectives (read, not asked)."""
    waiting = {r: rec for r, rec in read_boxes(folder).items() if rec is not None and rec["state"] == "in"
               and rec["waited"] > threshold}
    return len(waiting) > 1 and analyse(waiting)[0] == "desync"


_RECORD_KEY = "torchfleet/watchdog/record/"


def store_desync(store: Any, rank: int, world_size: int, fresh: float) -> dict[int, dict[str, Any]] | None:
    """Without a launcher's folder (torchrun): publish this rank's wait in the rendezvous store, read the others'.

    Returns every waiting rank's record when they wait in different collectives, else None. A record older than
    ``fresh`` seconds belongs to an earlier wait.
    """
    mine = current()
    mine["waited"] = time.monotonic() - mine["started"]
    mine["at"] = time.time()
    store.set(f"{_RECORD_KEY}{rank}", json.dumps(mine))
    records = {rank: mine}
    for other in range(world_size):
        key = f"{_RECORD_KEY}{other}"
        if other == rank or not store.check([key]):
            continue
        rec = json.loads(store.get(key))
        if rec["state"] == "in" and time.time() - rec["at"] < fresh:
            records[other] = rec
    return records if len(records) > 1 and analyse(records)[0] == "desync" else None
