"""The "dcp" layout of sharded checkpoints: torch.distributed.checkpoint files beside torchfleet.pt.

Entries that a strategy hands over as ``DCPStateDict`` (model state dicts whose tensors may be
DTensor shards, optimizer states in the FQN-keyed form of
``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict``) go into the DCP files; the rest
of the checkpoint goes into ``torchfleet.pt``. DCP records every tensor's global shape and where
each shard lives, so the files load at any world size: into sharded modules in place
(``load_dcp_into``), or whole into one process without a process group (``read_dcp_full``).

Single-file checkpoints keep optimizer states in ``torch.optim``'s positional form (parameters
numbered 0, 1, ... in parameter-group order); ``optimizer_state_to_positional`` and
``optimizer_state_to_fqn`` convert between the two.

DCP's own reader unpickles ``.metadata`` and the non-tensor entries with a full unpickler; here
``.metadata`` is read by an unpickler that builds DCP's metadata classes only, and every
non-tensor entry passes torch's weights-only loader first (``weights_only=False`` trusts the files).
A load that fails is reported as one CheckpointError naming the file, never as DCP's per-rank tracebacks.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

from torchfleet.checkpoint import integrity, safe
from torchfleet.checkpoint.distributed import (
    META_NAME,
    Ranks,
    atomic_checkpoint_dir,
    read_meta,
    sharded_marker,
    write_meta,
)
from torchfleet.checkpoint.schema import FORMAT_KEY
from torchfleet.checkpoint.write_errors import no_room
from torchfleet.errors import CheckpointError

#: key in the format marker listing the entries stored in the DCP files: {key: None (one dict) | n (a list of n)}
SHARDED_ENTRIES = "sharded_entries"


#: what a sharded entry holds: a module's state dict, or an optimizer's state (FQN-keyed in the files)
KINDS = ("module", "optimizer")


class DCPStateDict(dict):
    """A state dict that goes into the DCP files of a sharded checkpoint (its tensors may be DTensor shards).

    ``kind`` is "module" or "optimizer" (optimizer states are FQN-keyed, see ``optimizer_state_to_fqn``).
    """

    def __init__(self, state: Mapping[str, Any], kind: str = "module") -> None:
        super().__init__(state)
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}; accepted: {KINDS}")
        self.kind = kind


class DCPEntry:
    """Stands for an entry of a loaded "dcp" checkpoint that is still on disk; the strategy loads it in place.

    ``key`` is the checkpoint entry ("state_dict", "optimizer_states"), ``kind`` "module" or
    "optimizer", ``index`` the position in a list entry (one per optimizer), or None;
    ``weights_only``: whether its files are read without running code from them (the load's choice).
    """

    def __init__(self, path: str, key: str, kind: str, index: int | None = None, weights_only: bool = True) -> None:
        self.path, self.key, self.kind, self.index = path, key, kind, index
        self.weights_only = weights_only

    @property
    def prefix(self) -> str:
        """The prefix of this entry's flattened keys in the DCP metadata."""
        return self.key if self.index is None else f"{self.key}.{self.index}"

    def __repr__(self) -> str:
        where = self.key if self.index is None else f"{self.key}[{self.index}]"
        return f"DCPEntry({where} in {self.path!r})"


def _is_sharded(value: Any) -> bool:
    return isinstance(value, DCPStateDict) or (
        isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, DCPStateDict) for v in value)
    )


def save_dcp_checkpoint(path: str | os.PathLike, plain: Mapping[str, Any], ranks: Ranks) -> None:
    """Write ``plain`` as a "dcp" layout directory at ``path`` (every rank calls it; atomic).

    Its ``DCPStateDict`` entries (and lists of them) go into the DCP files, the rest into torchfleet.pt.
    """
    import torch.distributed.checkpoint as dcp

    sharded = {k: (dict(v) if isinstance(v, DCPStateDict) else [dict(x) for x in v])
               for k, v in plain.items() if _is_sharded(v)}
    meta = {k: v for k, v in plain.items() if k not in sharded}
    marker = sharded_marker("dcp")
    marker[SHARDED_ENTRIES] = {
        k: {"kind": (v if isinstance(v, DCPStateDict) else v[0]).kind,
            "count": None if isinstance(v, DCPStateDict) else len(v)}
        for k, v in plain.items() if k in sharded
    }
    meta[FORMAT_KEY] = marker
    with atomic_checkpoint_dir(path, ranks) as tmp:
        try:
            dcp.save(sharded, checkpoint_id=tmp)
            if ranks.is_global_zero:  # DCP's save ends with rank 0 writing .metadata after every rank's files
                marker.update(integrity.record(tmp, META_NAME))
                write_meta(tmp, meta)
        except BaseException as exc:  # DCP's CheckpointException is one; a full disk: one paragraph, not tracebacks
            failure = no_room(path, exc)
            if failure is None:
                raise
            raise failure from None


def read_dcp_checkpoint(path: str | os.PathLike, weights_only: bool = True) -> dict[str, Any]:
    """The checkpoint dict of a "dcp" directory: its meta, with a ``DCPEntry`` for each entry in the DCP files."""
    path = os.fspath(path)
    meta = read_meta(path, weights_only)
    checkpoint = dict(meta)
    for key, info in meta[FORMAT_KEY].get(SHARDED_ENTRIES, {}).items():
        kind, count = info["kind"], info["count"]
        checkpoint[key] = (DCPEntry(path, key, kind, weights_only=weights_only) if count is None
                           else [DCPEntry(path, key, kind, i, weights_only) for i in range(count)])
    return checkpoint


# ---------------------------------------------------------------------------- reading the files safely
#: the classes a DCP ``.metadata`` pickle is made of (torch 2.x)
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
      ("torch.serialization", "_get_layout"), ("collections", "OrderedDict")} | {
    ("pathlib", name) for name in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath")}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes, dtypes and paths; any other global is refused (named), never imported."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if (module, name) in _METADATA_GLOBALS or (
                module == "torch" and isinstance(vars(torch).get(name), (torch.dtype, torch.layout, torch.memory_format))):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name} is not part of DCP's metadata")


def _checked_bytes(value: io.BytesIO) -> io.BytesIO:
    """``value`` after torch's weights-only loader read it without complaint (the same bytes, rewound)."""
    data = value.read()
    safe.load(io.BytesIO(data), what="an entry of the DCP files")
    return io.BytesIO(data)


@functools.cache
def _safe_types() -> tuple[type, type, type]:
    """DCP's reader and load planners, reading ``.metadata`` and non-tensor entries without running their code."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if hasattr(self, "_get_metadata_path"):  # newer torch (per-rank metadata files); 2.8 has one file
                path = self._get_metadata_path(kwargs.get("rank"))
            else:
                path = self.fs.concat_path(self.path, ".metadata")
            with self.fs.create_stream(path, "rb") as stream:
                try:
                    metadata = _MetadataUnpickler(stream).load()
                except pickle.UnpicklingError as exc:
                    raise safe.refusal(repr(os.fspath(path)), safe.GLOBAL_NAME.findall(str(exc)), exc) from None
            if getattr(metadata, "storage_meta", None) is None:  # as FileSystemReader.read_metadata does
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            super().load_bytes(read_item, _checked_bytes(value))

    class SafeFullPlanner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            super().load_bytes(read_item, _checked_bytes(value))

    return SafeReader, SafePlanner, SafeFullPlanner


def _reader(path: str, weights_only: bool) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    return _safe_types()[0](path) if weights_only else FileSystemReader(path)


def _failure(path: str, exc: BaseException) -> CheckpointError:
    """One paragraph for a failed DCP read (``exc`` may be DCP's CheckpointException holding every rank's error)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, Mapping) and failures:
        ranks = sorted(failures)
        exc = next(iter(failures[r][0] for r in ranks))
        who = f" (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
    else:
        who = ""
    if isinstance(exc, CheckpointError):
        return CheckpointError(str(exc))
    if isinstance(exc, FileNotFoundError):
        return CheckpointError(
            f"The sharded checkpoint {path!r} is incomplete: {exc.filename or exc} is missing{who}. A file of it was "
            "deleted or never copied; resume from another checkpoint (ModelCheckpoint keeps the last complete ones)."
        )
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return CheckpointError(
        f"The DCP files of {path!r} cannot be read{who}: {type(exc).__name__}: {detail}. The directory is damaged "
        "or was not written by a torchfleet sharded strategy; resume from another checkpoint."
    )


def _metadata(path: str, weights_only: bool = True) -> Any:
    try:
        return _reader(path, weights_only).read_metadata()
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(
            f"The sharded checkpoint {path!r} has no .metadata file, which lists where every saved tensor is: the "
            "directory is incomplete or damaged. Resume from another checkpoint."
        ) from None
    except Exception as exc:
        raise _failure(path, exc) from None


def files_problem(path: str | os.PathLike, weights_only: bool = True, share: tuple[int, int] = (0, 1)) -> str | None:
    """What keeps the DCP files at ``path`` from loading (a missing, short, unsafe or foreign file, chunks that do not
    tile a tensor: see torchfleet.checkpoint.integrity), or None.

    Checked before any rank starts DCP's collective read, so that all can agree the load fails; ``share`` (rank,
    ranks) splits the files' comparison with the save's record between ranks that agree afterwards.
    """
    path = os.fspath(path)
    try:
        metadata = _metadata(path, weights_only)
        marker = read_meta(path, weights_only).get(FORMAT_KEY)
    except CheckpointError as exc:
        return str(exc)
    problem = integrity.cover_problem(path, metadata) or integrity.files_changed(
        path, marker if isinstance(marker, Mapping) else {}, share)
    if problem:
        return problem
    storage = metadata.storage_data
    needed: dict[str, int] = {}
    for info in (storage or {}).values():
        rel = getattr(info, "relative_path", None)
        if rel is not None:
            needed[rel] = max(needed.get(rel, 0), int(info.offset) + int(info.length))
    for rel, size in sorted(needed.items()):
        file = os.path.join(path, rel)
        try:
            have = os.path.getsize(file)
        except OSError:
            return str(_failure(path, FileNotFoundError(2, "missing", file)))
        if have < size:
            return (f"The sharded checkpoint {path!r} is incomplete: {file} holds {have} bytes where its .metadata "
                    f"places data up to byte {size} (a copy or a save cut short). Resume from another checkpoint.")
    return None


def _flatten(template: Mapping[str, Any]) -> dict[str, Any]:
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict(dict(template))
    return flat


def _listing(items: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(k) for k in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def check_against_checkpoint(template: Mapping[str, Any], path: str, strict: bool = True,
                             weights_only: bool = True) -> None:
    """Raise CheckpointError naming the first keys of ``template`` that the DCP files at ``path`` lack,
    the first they hold beyond it (strict only), and tensors whose global shapes differ."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    saved = _metadata(path, weights_only).state_dict_metadata
    wanted = _flatten(template)
    roots = {k.split(".", 1)[0] for k in template}
    # optimizer entries hold scalars (step counts) whose form depends on the optimizer; only tensors are matched
    missing = [k for k, v in wanted.items() if k not in saved and hasattr(v, "shape")]
    unexpected = [k for k, v in saved.items()
                  if k.split(".", 1)[0] in roots and k not in wanted and isinstance(v, TensorStorageMetadata)]
    shapes = [f"{k!r} (checkpoint {tuple(saved[k].size)}, model {tuple(v.shape)})" for k, v in wanted.items()
              if k in saved and isinstance(saved[k], TensorStorageMetadata) and hasattr(v, "shape")
              and tuple(saved[k].size) != tuple(v.shape)]
    problems = []
    if missing and strict:
        problems.append(f"missing from the checkpoint: {_listing(missing)}")
    if unexpected and strict:
        problems.append(f"in the checkpoint but not in the model: {_listing(unexpected)}")
    if shapes:
        problems.append("shape differs for " + ", ".join(shapes[:5]) + (" ..." if len(shapes) > 5 else ""))
    if problems:
        raise CheckpointError(
            f"The sharded checkpoint {path!r} does not fit the model: {'; '.join(problems)}. The model's architecture "
            "or hyperparameters differ from the run that wrote it; build the model with the same arguments"
            + (", or load with strict=False to skip missing and extra keys." if not shapes else ".")
        )


def saved_keys(path: str, weights_only: bool = True) -> set[str]:
    """The flattened keys ("state_dict.net.0.weight", "optimizer_states.0.state.net.0.weight.exp_avg", ...) in the DCP files."""
    return set(_metadata(path, weights_only).state_dict_metadata)


def load_dcp_into(path: str, template: dict[str, Any], strict: bool = True, weights_only: bool = True) -> None:
    """Fill ``template`` (state dicts of sharded or plain tensors) in place from the DCP files at ``path``.

    Every rank calls it; DCP gathers the ranks' read errors, so all of them raise the same CheckpointError.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    check_against_checkpoint(template, path, strict=strict, weights_only=weights_only)
    planner = (_safe_types()[1] if weights_only else DefaultLoadPlanner)(allow_partial_load=not strict)
    try:
        dcp.load(template, storage_reader=_reader(path, weights_only), planner=planner)
    except CheckpointException as exc:
        raise _failure(path, exc) from None


def read_dcp_full(path: str | os.PathLike, keys: set[str] | None = None, weights_only: bool = True) -> dict[str, Any]:
    """The entries (all, or ``keys``) of the DCP files at ``path`` as whole tensors, in this one process.

    Needs no process group and no model: the shapes come from the DCP metadata. The whole model
    (and optimizer, if asked for) must fit this process's memory.
    """
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    path = os.fspath(path)
    state: dict[str, Any] = {}
    planner = (_safe_types()[2] if weights_only else _EmptyStateDictLoadPlanner)(keys=keys)
    try:
        # dcp.load rebuilds its argument's keys first, so a planner that creates them needs the inner loader
        _load_state_dict(state, storage_reader=_reader(path, weights_only), planner=planner, no_dist=True)
    except (CheckpointException, OSError, pickle.UnpicklingError) as exc:
        # a shard cut short fails inside DCP's reader without naming its file (EOFError): name it where we can
        raise CheckpointError(files_problem(path, weights_only) or str(_failure(path, exc))) from None
    return state


def read_full_dcp_checkpoint(path: str | os.PathLike, with_optimizer: bool = True,
                             weights_only: bool = True) -> dict[str, Any]:
    """A "dcp" directory as one ordinary checkpoint dict: whole tensors, optimizer states in positional form."""
    path = os.fspath(path)
    checkpoint = read_dcp_checkpoint(path, weights_only)
    problem = files_problem(path, weights_only)
    if problem:
        raise CheckpointError(problem)
    entries = {k: v for k, v in checkpoint.items() if _holds_entries(v)}
    kinds = {k: (v if isinstance(v, DCPEntry) else v[0]).kind for k, v in entries.items()}
    wanted = {k for k in entries if with_optimizer or kinds[k] != "optimizer"}
    loaded = read_dcp_full(path, keys=wanted, weights_only=weights_only) if wanted else {}
    for key, entry in entries.items():
        if key not in wanted:
            del checkpoint[key]
            continue
        value = loaded.get(key, {})
        if isinstance(entry, list):
            value = _as_list(value, len(entry))
        if kinds[key] == "optimizer":
            value = ([optimizer_state_to_positional(v) for v in value] if isinstance(entry, list)
                     else optimizer_state_to_positional(value))
        checkpoint[key] = value
    marker = dict(checkpoint[FORMAT_KEY])
    for key in (SHARDED_ENTRIES, integrity.SAVE_ID, integrity.FILES):  # of the directory, not of one file
        marker.pop(key, None)
    checkpoint[FORMAT_KEY] = marker
    return checkpoint


def _holds_entries(value: Any) -> bool:
    return isinstance(value, DCPEntry) or (isinstance(value, list) and bool(value)
                                           and all(isinstance(v, DCPEntry) for v in value))


def _as_list(value: Any, count: int) -> list[Any]:
    # DCP stores a list as a mapping of its indices when read back without a template
    if isinstance(value, Mapping):
        return [value.get(i, value.get(str(i), {})) for i in range(count)]
    return list(value)


# ---------------------------------------------------------------------------- optimizer state forms
def optimizer_state_to_positional(state: Mapping[str, Any]) -> dict[str, Any]:
    """An FQN-keyed optimizer state dict in ``torch.optim``'s positional form (what ``Optimizer.load_state_dict`` takes).

    Parameters are numbered in the order their names appear in the parameter groups, which is
    the order ``Optimizer.state_dict`` numbers them in.
    """
    groups, numbered, index = [], {}, 0
    for group in state.get("param_groups", []):
        names = list(group["params"])
        ids = list(range(index, index + len(names)))
        numbered.update(zip(names, ids))
        index += len(names)
        groups.append({**group, "params": ids})
    per_param = {numbered[name]: value for name, value in state.get("state", {}).items() if name in numbered}
    return {"state": per_param, "param_groups": groups}


def optimizer_state_to_fqn(state: Mapping[str, Any], names: Sequence[Sequence[str]]) -> dict[str, Any]:
    """A positional optimizer state dict keyed by parameter names instead: ``names[g]`` lists group g's names."""
    saved = state.get("param_groups", [])
    if [len(g["params"]) for g in saved] != [len(n) for n in names]:
        raise CheckpointError(
            f"The checkpoint's optimizer has parameter groups of sizes {[len(g['params']) for g in saved]}, the "
            f"optimizer to load into {[len(n) for n in names]}. Build the optimizer as in the run that wrote it."
        )
    by_id: dict[Any, str] = {}
    groups = []
    for group, group_names in zip(saved, names):
        by_id.update(zip(group["params"], group_names))
        groups.append({**group, "params": list(group_names)})
    per_param = {by_id[i]: value for i, value in state.get("state", {}).items() if i in by_id}
    return {"state": per_param, "param_groups": groups}

