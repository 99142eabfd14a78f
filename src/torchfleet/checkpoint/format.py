"""A torchfleet training checkpoint: its keys and the check that a dict is one (schema.py), and ``read_checkpoint``,
which reads one whole, a file or a sharded directory of any layout."""

from __future__ import annotations

import os
from typing import Any

from torchfleet.checkpoint.consolidate import read_full_checkpoint
from torchfleet.checkpoint.schema import (
    FORMAT_KEY,
    FORMAT_VERSION,
    HPARAMS_KEY,
    REQUIRED_KEYS,
    check_checkpoint,
    read_checked_file,
)

__all__ = ["FORMAT_KEY", "FORMAT_VERSION", "HPARAMS_KEY", "REQUIRED_KEYS", "check_checkpoint", "read_checkpoint"]


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu", weights_only: bool = True) -> dict[str, Any]:
    """Read and check a torchfleet checkpoint (a file, or a sharded directory read whole) with the default CheckpointIO.

    ``weights_only=False`` unpickles anything the file holds: only for files you trust.
    """
    if os.path.isdir(path):
        return read_full_checkpoint(path, weights_only=weights_only)
    return read_checked_file(path, map_location, weights_only)
