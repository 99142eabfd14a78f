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
from torchfleet.checkpoint.format import FORMAT_KEY, FORMAT_VERSION, check_checkpoint, read_checkpoint
from torchfleet.checkpoint.io import CheckpointIO, TorchCheckpointIO
from torchfleet.errors import CheckpointError


def read_full_checkpoint(path: str | os.PathLike, with_optimizer: bool = True) -> dict[str, Any]:
    """The checkpoint at ``path`` (a file, a "dcp" or a "deepspeed" directory) as one dict of whole tensors.

    Optimizer states come in ``torch.optim``'s positional form, as in single-file checkpoints;
    without ``with_optimizer`` they are left out (and not read, which saves memory and time).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        layout = checkpoint_layout(path)
        if layout == "dcp":
            return check_checkpoint(read_full_dcp_checkpoint(path, with_optimizer=with_optimizer), path)
        checkpoint = check_checkpoint(consolidate_deepspeed(path, with_optimizer=with_optimizer), path)
    else:
        checkpoint = read_checkpoint(path)
    if not with_optimizer:
        checkpoint.pop("optimizer_states", None)
    return checkpoint


def read_keeping_dcp_entries(path: str | os.PathLike, checkpoint_io: CheckpointIO) -> dict[str, Any]:
    """The checkpoint at ``path`` for loading into sharded modules: a "dcp" directory's entries stay on disk (``DCPEntry``).

    Other directories are read whole (``read_full_checkpoint``), files through ``checkpoint_io``.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        if checkpoint_layout(path) == "dcp":
            return read_dcp_checkpoint(path)
        return read_full_checkpoint(path)
    return checkpoint_io.load_checkpoint(path, map_location="cpu")


def consolidate(src: str | os.PathLike, out: str | os.PathLike, with_optimizer: bool = False) -> dict[str, Any]:
    """Write the checkpoint at ``src`` (any layout, any world size) as one ``torch.load``-able file at ``out``.

    The file is an ordinary single-file torchfleet checkpoint: ``torch.load(out)["state_dict"]``
    loads into the plain module, and, written ``with_optimizer``, ``fit(ckpt_path=out)`` resumes
    from it under any strategy. Returns a summary (entries, parameter tensors, bytes written).
    """
    src, out = os.fspath(src), os.fspath(out)
    if os.path.abspath(src) == os.path.abspath(out):
        raise CheckpointError(f"consolidate would overwrite its input {src!r}; give another output path.")
    checkpoint = read_full_checkpoint(src, with_optimizer=with_optimizer)
    import torchfleet

    checkpoint[FORMAT_KEY] = {"version": torchfleet.__version__, "format": FORMAT_VERSION}
    TorchCheckpointIO().save_checkpoint(checkpoint, out)
    weights = checkpoint.get("state_dict", {})
    return {
        "entries": sorted(checkpoint),
        "tensors": sum(1 for v in weights.values() if hasattr(v, "shape")),
        "parameters": sum(int(v.numel()) for v in weights.values() if hasattr(v, "numel")),
        "optimizer": "optimizer_states" in checkpoint,
        "bytes": os.path.getsize(out),
    }
