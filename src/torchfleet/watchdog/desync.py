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
from torchfleet.watchdog.groups import group_ranks, over
from torchfleet.watchdog.numbering import current


def analyse(records: dict[int, dict[str, Any] | None]) -> tuple[str, list[str]]:
    """(kind, lines): kind is "desync", "hang" or ""; lines explain it, naming the call sites.

    A collective over a group of ranks (a record's ``group``: groups.py) is compared with the records of that group's
    ranks only, by its number within the group; so groups that each run their own collectives do not disagree.
    """
    known = {r: rec for r, rec in records.items() if rec is not None and rec.get("seq")}
    if len(known) < 2:
        return "", []
    # the first number at which two ranks' recent collectives differ (name or place in the loop)
    common = sorted(set.union(*(set(rec.get("history") or {}) for rec in known.values())), key=_order)
    for key in common:
        seen = {r: rec["history"][key] for r, rec in known.items() if key in (rec.get("history") or {})}
        if len(seen) > 1 and len({(n, w) for n, _, w in seen.values()}) > 1:
            a = next(iter(seen))
            b = next(r for r in seen if (seen[r][0], seen[r][2]) != (seen[a][0], seen[a][2]))
            (na, sa, wa), (nb, sb, wb) = seen[a], seen[b]
            return _desync(known, (
                f"Desync: the ranks called different collectives as #{_number(key)}{over(_group(key))}: rank {a} "
                f"{na} at {sa}{f' ({wa})' if wa else ''}, rank {b} {nb} at {sb}{f' ({wb})' if wb else ''}."
            ))
    by_key: dict[Any, list[int]] = {}
    for r, rec in known.items():
        by_key.setdefault(_key(rec), []).append(r)
    # the same number, different collectives: the ranks left the common order before this one
    for key, ranks in sorted(by_key.items(), key=lambda item: _order(item[0])):
        names = {known[r]["name"] for r in ranks}
        if len(names) > 1:
            a, b = ranks[0], next(r for r in ranks if known[r]["name"] != known[ranks[0]]["name"])
            return _desync(known, (
                f"Desync: the ranks called different collectives as #{_number(key)}{over(_group(key))}: rank {a} "
                f"{known[a]['name']} at {known[a]['site']}{_at(known[a])}, rank {b} {known[b]['name']} at "
                f"{known[b]['site']}{_at(known[b])}."
            ))
    waiting = {r: rec for r, rec in known.items() if rec["state"] == "in"}
    world = {r: rec for r, rec in known.items() if not rec.get("group")}
    by_seq: dict[int, list[int]] = {}
    for r, rec in world.items():
        by_seq.setdefault(rec["seq"], []).append(r)
    if len(by_seq) > 1:  # ranks at different numbers of the collectives over every rank
        top = max(by_seq)
        ahead = by_seq[top]
        behind = sorted(r for r in world if world[r]["seq"] < top)
        behind_waiting = [r for r in behind if r in waiting]
        a = ahead[0]
        if behind_waiting:
            return _desync(known, _apart(known, a, behind_waiting[0]))
        return "hang", [_never(known, a, behind)]
    # a rank in a collective that another rank of its group (or of the world) has not reached: collectives over a
    # group first (the more precise); a rank that failed in one was in it when the run was stopped
    stuck = {r: rec for r, rec in known.items() if rec["state"] in ("in", "failed")}
    for a in sorted(stuck, key=lambda r: (not stuck[r].get("group"), r)):
        key = _key(stuck[a])
        members = group_ranks(stuck[a].get("group") or "")
        missing = [b for b in sorted(known) if b != a and (members is None or b in members)
                   and not _reached(known[b], key)]
        waiting_elsewhere = [b for b in missing if b in stuck]
        if waiting_elsewhere:
            return _desync(known, _apart(known, a, waiting_elsewhere[0]))
        if missing:
            return "hang", [_never(known, a, missing)]
    if len(waiting) == len(known):
        if len(by_key) == 1:
            first = known[next(iter(known))]
            return "hang", [f"Hang: every rank waits in the same collective #{first['seq']} {first['name']}"
                            f"{_over(first)}: "
                            "the collective itself does not complete (network, or a process outside this run)."]
        groups = "; ".join(f"#{known[ranks[0]]['seq']} {known[ranks[0]]['name']}{_over(known[ranks[0]])}"
                           for _, ranks in sorted(by_key.items(), key=lambda item: _order(item[0])))
        return "hang", [f"Hang: every rank waits in a collective that all the ranks of its group are in ({groups}): "
                        "the collectives themselves do not complete (network, or a process outside this run)."]
    return "", []


def _key(rec: dict[str, Any]) -> Any:
    """A record's collective as the history keys it: its number, or (group, number) for one over a group."""
    group = rec.get("group") or ""
    return (group, rec["seq"]) if group else rec["seq"]


def _group(key: Any) -> str:
    return key[0] if isinstance(key, tuple) else ""


def _number(key: Any) -> int:
    return key[1] if isinstance(key, tuple) else key


def _order(key: Any) -> tuple:
    """The collectives over every rank first, then each group's, by number."""
    return (1, key[0], key[1]) if isinstance(key, tuple) else (0, "", key)


def _reached(rec: dict[str, Any], key: Any) -> bool:
    """Whether the rank of ``rec`` has begun the collective ``key`` (or a later one of the same group)."""
    group, number = _group(key), _number(key)
    numbers = [_number(k) for k in (rec.get("history") or {}) if _group(k) == group]
    if (rec.get("group") or "") == group:
        numbers.append(rec["seq"])
    return any(n >= number for n in numbers)


def _over(rec: dict[str, Any]) -> str:
    return over(rec.get("group") or "")


def _apart(known: dict[int, dict[str, Any]], a: int, b: int) -> str:
    """Rank ``a`` is in one collective while rank ``b`` waits in another: the first line of the desync."""
    ra, rb = known[a], known[b]
    return (f"Desync: rank {a} is in #{ra['seq']} {ra['name']}{_over(ra)} (called at {ra['site']}{_at(ra)}) "
            f"while rank {b} waits in #{rb['seq']} {rb['name']}{_over(rb)} (called at {rb['site']}{_at(rb)}): the "
            "ranks issued different numbers of collectives.")


def _never(known: dict[int, dict[str, Any]], a: int, behind: list[int]) -> str:
    """Rank ``a`` waits in a collective that the ranks ``behind`` never reached: the hang's line."""
    ra, rb, b = known[a], known[behind[0]], behind[0]
    return (f"Hang: rank {a} waits in #{ra['seq']} {ra['name']}{_over(ra)} (called at {ra['site']}{_at(ra)}), "
            f"which rank{'s' if len(behind) > 1 else ''} {', '.join(map(str, behind))} never reached: rank {b}'s "
            f"last collective was #{rb['seq']} {rb['name']}{_over(rb)} (called at {rb['site']}{_at(rb)}); "
            "it is still in its own code or in a collective torchfleet does not see (its stack is below), or it "
            "skipped this collective (code that runs on some ranks only).")


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
            f"rank {r} {rec.get('where') or 'outside the Trainer loops'} (#{rec['seq']}{_over(rec)})"
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
