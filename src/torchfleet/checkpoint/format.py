"""The layout of a torchfleet training checkpoint, and the check that a file is one."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from torchfleet.errors import CheckpointError

#: key holding the format marker; its value is {"version": torchfleet version, "format": FORMAT_VERSION}
FORMAT_KEY = "torchfleet"
FORMAT_VERSION = 1

#: keys every Trainer checkpoint has
REQUIRED_KEYS = ("state_dict", "epoch", "global_step")


def check_checkpoint(checkpoint: Any, path: str | os.PathLike) -> dict[str, Any]:
    """Return ``checkpoint`` if it is a torchfleet training checkpoint, else raise CheckpointError."""
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(
            f"{os.fspath(path)!r} holds a {type(checkpoint).__name__}, not a torchfleet checkpoint (a dict written "
            "by Trainer.save_checkpoint or ModelCheckpoint). To start from plain weights, load them into the model "
            "with model.load_state_dict(torch.load(path)) before calling fit, without ckpt_path."
        )
    missing = [k for k in REQUIRED_KEYS if k not in checkpoint]
    if missing:
        keys = ", ".join(map(repr, list(checkpoint)[:8])) or "none"
        raise CheckpointError(
            f"{os.fspath(path)!r} is not a torchfleet checkpoint: it lacks {', '.join(map(repr, missing))} (its keys: "
            f"{keys}). Resume from a file written by Trainer.save_checkpoint or ModelCheckpoint; to start from "
            "plain weights, load them into the model before calling fit, without ckpt_path."
        )
    return dict(checkpoint)


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Read and check a torchfleet checkpoint (a file, or a sharded directory read whole) with the default CheckpointIO."""
    if os.path.isdir(path):
        from torchfleet.checkpoint.consolidate import read_full_checkpoint

        return read_full_checkpoint(path)
    from torchfleet.checkpoint.io import TorchCheckpointIO

    return check_checkpoint(TorchCheckpointIO().load_checkpoint(path, map_location=map_location), path)
