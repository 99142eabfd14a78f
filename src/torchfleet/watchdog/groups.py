"""How a collective over part of the ranks (a process group, a device mesh dimension) is written in the records.

A record's group is text, ``""`` for every rank, else ``"name|ranks"``: the mesh dimension's name when known (else
empty) and the group's global ranks, e.g. ``"tensor_parallel|2,3"``, or ``"data_parallel|0,4,...,60"`` for an
arithmetic progression of more than four ranks (what every device mesh dimension is). Collectives over a group are
numbered per group (numbering.py), so the same text and number name the same collective on every rank of the group.
"""

from __future__ import annotations


def group_text(ranks: list[int] | tuple[int, ...], name: str | None = None) -> str:
    """The record's text for a collective over ``ranks`` (global ranks), named ``name`` (a mesh dimension)."""
    ranks = sorted(ranks)
    step = ranks[1] - ranks[0] if len(ranks) > 1 else 1
    if len(ranks) > 4 and step > 0 and all(b - a == step for a, b in zip(ranks, ranks[1:])):
        listed = f"{ranks[0]},{ranks[1]},...,{ranks[-1]}"
    else:
        listed = ",".join(map(str, ranks))
    return f"{name or ''}|{listed}"


def group_ranks(text: str) -> set[int] | None:
    """The global ranks of a record's group; None for every rank (``""``)."""
    if not text:
        return None
    parts = text.split("|", 1)[-1].split(",")
    try:
        if "..." in parts:
            first, second, last = int(parts[0]), int(parts[1]), int(parts[-1])
            return set(range(first, last + 1, second - first))
        return {int(p) for p in parts if p}
    except (ValueError, IndexError):  # a record truncated in its slot
        return None


def over(text: str) -> str:
    """`` over 'tensor_parallel' (ranks 2,3)``, `` over ranks 0,2`` for a nameless group, ``""`` for every rank."""
    if not text:
        return ""
    name, _, listed = text.partition("|")
    return f" over '{name}' (ranks {listed})" if name else f" over ranks {listed}"
