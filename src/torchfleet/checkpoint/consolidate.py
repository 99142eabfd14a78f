"""Reading any torchfleet checkpoint whole in one process, and writing it as one ordinary file.

``read_full_checkpoint`` is how strategies that hold whole models (single_device, ddp, dp) load a
sharded checkpoint, and what ``torchfleet consolidate`` writes out: no process group and no
particular number of processes is needed, whatever world size wrote the checkpoint.
"""

from __future__ import annotations

import os
from typing import Any

from torchfleet.checkpoint.dcp import read_dcp_checkpoint, read_full_dcp_checkpoint
from torchfleet.checkpoint.deepspeed import consolidate_deepspeed
from torchfleet.checkpoint.distributed import checkpoint_layout
from torchfleet.checkpoint.hparams import to_plain
from torchfleet.checkpoint.io import CheckpointIO, TorchCheckpointIO, load_through
from torchfleet.checkpoint.schema import (
    FORMAT_KEY,
    FORMAT_VERSION,
    HPARAMS_KEY,
    check_checkpoint,
    read_checked_file,
)
from torchfleet.errors import CheckpointError


def read_full_checkpoint(path: str | os.PathLike, with_optimizer: bool = True, weights_only: bool = True) -> dict[str, Any]:
    """The checkpoint at ``path`` (a file, a "dcp" or a "deepspeed" directory) as one dict of whole tensors.

    Optimizer states come in ``torch.optim``'s positional form, as in single-file checkpoints;
    without ``with_optimizer`` they are left out (and not read, which saves memory and time).
    Every file is read without running code from it unless ``weights_only=False`` (files you trust).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        layout = checkpoint_layout(path, weights_only)
        if layout == "dcp":
            full = read_full_dcp_checkpoint(path, with_optimizer=with_optimizer, weights_only=weights_only)
            return check_checkpoint(full, path, weights_only)
        checkpoint = check_checkpoint(consolidate_deepspeed(path, with_optimizer, weights_only), path, weights_only)
    else:
        checkpoint = read_checked_file(path, weights_only=weights_only)
    if not with_optimizer:
        checkpoint.pop("optimizer_states", None)
    return checkpoint


def read_keeping_dcp_entries(path: str | os.PathLike, checkpoint_io: CheckpointIO,
                             weights_only: bool | None = None) -> dict[str, Any]:
    """The checkpoint at ``path`` for loading into sharded modules: a "dcp" directory's entries stay on disk (``DCPEntry``).

    Other directories are read whole (``read_full_checkpoint``), files through ``checkpoint_io``;
    ``weights_only`` None means ``checkpoint_io``'s setting.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        trusted = checkpoint_io.weights_only if weights_only is None else weights_only
        if checkpoint_layout(path, trusted) == "dcp":
            return read_dcp_checkpoint(path, trusted)
        return read_full_checkpoint(path, weights_only=trusted)
    return load_through(checkpoint_io, path, "cpu", weights_only)


def consolidate(src: str | os.PathLike, out: str | os.PathLike, with_optimizer: bool = False,
                weights_only: bool = True) -> dict[str, Any]:
    """Write the checkpoint at ``src`` (any layout, any world size) as one ``torch.load``-able file at ``out``.

    The file is an ordinary single-file torchfleet checkpoint: ``torch.load(out)["state_dict"]``
    loads into the plain module, and, written ``with_optimizer``, ``fit(ckpt_path=out)`` resumes
    from it under any strategy. Returns a summary (entries, parameter tensors, bytes written).
    ``src`` is read without running code from it unless ``weights_only=False`` (a checkpoint you trust).
    """
    src, out = os.fspath(src), os.fspath(out)
    if os.path.abspath(src) == os.path.abspath(out):
        raise CheckpointError(f"consolidate would overwrite its input {src!r}; give another output path.")
    checkpoint = read_full_checkpoint(src, with_optimizer=with_optimizer, weights_only=weights_only)
    import torchfleet

    checkpoint[FORMAT_KEY] = {"version": torchfleet.__version__, "format": FORMAT_VERSION}
    if HPARAMS_KEY in checkpoint:  # reading gave the objects back; the file keeps their plain form
        checkpoint[HPARAMS_KEY] = to_plain(checkpoint[HPARAMS_KEY])
    TorchCheckpointIO().save_checkpoint(checkpoint, out)
    weights = checkpoint.get("state_dict", {})
    return {
        "entries": sorted(checkpoint),
        "tensors": sum(1 for v in weights.values() if hasattr(v, "shape")),
        "parameters": sum(int(v.numel()) for v in weights.values() if hasattr(v, "numel")),
        "optimizer": "optimizer_states" in checkpoint,
        "bytes": os.path.getsize(out),
    }
