"""Proof that a "dcp" checkpoint directory is whole and one save's: its files' fingerprints and the chunk cover.

At save, rank 0 (after DCP's collective write, whose last step is rank 0 writing ``.metadata`` once every rank's
files are written) records each DCP file's size and a hash of sampled blocks in ``torchfleet.pt``'s format marker,
with an id of the save (``record``). A load compares the files on disk with that record before any rank reads a
tensor (``files_changed``; the ranks of a sharded load share the files between them): a shard copied from another run or save, a file cut short, grown or edited is refused
with one paragraph naming it. ``.metadata`` is small and hashed whole; a shard is hashed over its size, its first
and last blocks and blocks spread evenly between (``SAMPLES`` blocks of ``BLOCK`` bytes, 1 MiB in all), so the
check reads about 1 MiB per file whatever the checkpoint's size: another run's shard differs in every block, but a
change confined to bytes between the samples goes unseen. Checkpoints written before the record existed carry none
and skip this check.

Independently of the record, ``cover_problem`` checks that the chunks ``.metadata`` lists for each tensor tile its
global shape exactly (every chunk within bounds, no two overlapping, their volumes adding up to the tensor's), so
an edited or foreign ``.metadata`` can never leave rows or columns of a loaded tensor unwritten.
"""

from __future__ import annotations

import hashlib
import math
import os
import uuid
from collections.abc import Mapping
from typing import Any

#: the format marker's keys holding the save's id and {file name: {"size": bytes, "sample": hex digest}}
SAVE_ID, FILES = "save_id", "files"
#: a file up to this size is hashed whole; a larger one over SAMPLES blocks of BLOCK bytes
BLOCK, SAMPLES = 64 * 1024, 16


def fingerprint(file: str) -> dict[str, Any]:
    """``file``'s size and a blake2b hash of its sampled blocks (the whole file when it is at most 1 MiB)."""
    size = os.path.getsize(file)
    digest = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(file, "rb") as f:
        if size <= BLOCK * SAMPLES:
            digest.update(f.read())
        else:
            step = (size - BLOCK) / (SAMPLES - 1)
            for i in range(SAMPLES):
                f.seek(round(i * step))
                digest.update(f.read(BLOCK))
    return {"size": size, "sample": digest.hexdigest()}


def _data_files(directory: str, skip: str) -> list[str]:
    return sorted(e.name for e in os.scandir(directory)
                  if e.is_file() and e.name != skip and (e.name == ".metadata" or not e.name.startswith(".")))


def record(directory: str, skip: str) -> dict[str, Any]:
    """The marker entries that bind the files in ``directory`` (all but ``skip``, torchfleet.pt) to this save."""
    return {SAVE_ID: uuid.uuid4().hex,
            FILES: {name: fingerprint(os.path.join(directory, name)) for name in _data_files(directory, skip)}}


def files_changed(path: str, marker: Mapping[str, Any], share: tuple[int, int] = (0, 1)) -> str | None:
    """What differs between the files of the checkpoint at ``path`` and the record in its ``marker``, or None.

    ``share`` (rank, ranks): this process checks every ranks-th file from its rank on, where the ranks of a load
    share the check and then agree on its result."""
    recorded = marker.get(FILES)
    if not isinstance(recorded, Mapping):
        return None  # written before torchfleet recorded its files
    save = str(marker.get(SAVE_ID, "?"))[:12]
    rank, ranks = share
    for name, want in sorted(recorded.items())[rank::ranks]:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            return (f"The sharded checkpoint {path!r} is incomplete: {file} is missing (torchfleet.pt lists it among "
                    f"the files save {save} wrote). A file of it was deleted or never copied; resume from another "
                    "checkpoint (ModelCheckpoint keeps the last complete ones).")
        have = fingerprint(file)
        if have["size"] != want.get("size"):
            return (f"The sharded checkpoint {path!r} is damaged: {file} holds {have['size']} bytes where save {save} "
                    f"wrote {want.get('size')} (a copy or a write cut short, or a file from another run or save). "
                    "Resume from another checkpoint.")
        if have["sample"] != want.get("sample"):
            return (f"The sharded checkpoint {path!r} is not one save's: {file} is not the file save {save} wrote (its "
                    "bytes differ from the hash torchfleet.pt recorded at save): a file copied from another run or "
                    "save, or changed since. Resume from another checkpoint, or copy the whole directory again.")
    return None


def cover_problem(path: str, metadata: Any) -> str | None:
    """What is wrong with how ``.metadata``'s chunks tile each tensor's global shape, or None when each does exactly."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    for fqn, item in metadata.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            continue
        shape = tuple(int(s) for s in item.size)
        boxes = []
        for chunk in item.chunks:
            offsets, sizes = tuple(int(o) for o in chunk.offsets), tuple(int(s) for s in chunk.sizes)
            if len(offsets) != len(shape) or len(sizes) != len(shape) or any(
                    o < 0 or s < 0 or o + s > n for o, s, n in zip(offsets, sizes, shape)):
                return _bad_cover(path, fqn, shape, f"a chunk at offsets {offsets} of sizes {sizes} lies outside it")
            boxes.append((offsets, sizes))
        covered = sum(math.prod(s) for _, s in boxes)
        if covered != math.prod(shape):
            return _bad_cover(path, fqn, shape, f"its chunks hold {covered} elements, not {math.prod(shape)}"
                              + (" (some of it is in no chunk)" if covered < math.prod(shape) else ""))
        overlap = _overlap(boxes)
        if overlap:
            return _bad_cover(path, fqn, shape, f"the chunks at offsets {overlap[0]} and {overlap[1]} overlap")
    return None


def _overlap(boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> tuple[Any, Any] | None:
    """Two boxes that share an element, found by sweeping along the first dimension (rows: FSDP's shards)."""
    boxes = sorted((b for b in boxes if all(b[1])), key=lambda b: b[0][:1])
    for i, (offsets, sizes) in enumerate(boxes):
        for other, other_sizes in boxes[i + 1:]:
            if offsets and other[0] >= offsets[0] + sizes[0]:
                break
            if all(o < p + q and p < o + s for o, s, p, q in zip(offsets, sizes, other, other_sizes)):
                return offsets, other
    return None


def _bad_cover(path: str, fqn: str, shape: tuple[int, ...], what: str) -> str:
    return (f"The sharded checkpoint {path!r} is damaged: {os.path.join(path, '.metadata')} gives {fqn!r} the shape "
            f"{shape}, but {what}, so loading would leave part of the tensor unwritten. The .metadata file was edited "
            "or comes from another save; resume from another checkpoint.")
