"""What a torchfleet training checkpoint holds (its keys, the format marker), the check that a dict is one, and
reading one such file.

The lowest checkpoint module: every layout's writer and reader (distributed.py, dcp.py, deepspeed.py) names these
keys, and reading a sharded directory whole (consolidate.py) checks its result here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from torchfleet.checkpoint import safe
from torchfleet.checkpoint.hparams import UntrustedCallable, from_plain
from torchfleet.checkpoint.io import TorchCheckpointIO
from torchfleet.errors import CheckpointError

#: key holding the format marker; its value is {"version": torchfleet version, "format": FORMAT_VERSION}
FORMAT_KEY = "torchfleet"
FORMAT_VERSION = 1

#: keys every Trainer checkpoint has
REQUIRED_KEYS = ("state_dict", "epoch", "global_step")
#: the key of the module's hyperparameters, written in plain form (torchfleet.checkpoint.hparams)
HPARAMS_KEY = "hyper_parameters"


def check_checkpoint(checkpoint: Any, path: str | os.PathLike, weights_only: bool = True) -> dict[str, Any]:
    """Return ``checkpoint`` if it is a torchfleet training checkpoint, else raise CheckpointError.

    Its hyperparameters come back as the objects they were saved from (see torchfleet.checkpoint.hparams); one
    naming a callable that is not trusted is refused as safe loading refuses a global, unless ``weights_only=False``.
    """
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
    checkpoint = dict(checkpoint)
    if HPARAMS_KEY in checkpoint:
        try:
            checkpoint[HPARAMS_KEY] = from_plain(checkpoint[HPARAMS_KEY], trust=not weights_only)
        except UntrustedCallable as exc:
            raise safe.refusal(repr(os.fspath(path)), [exc.name]) from None
    return checkpoint


def read_checked_file(path: str | os.PathLike, map_location: Any = "cpu", weights_only: bool = True) -> dict[str, Any]:
    """Read one checkpoint file with the default CheckpointIO and check that it is a torchfleet checkpoint.

    ``weights_only=False`` unpickles anything the file holds: only for files you trust.
    """
    io = TorchCheckpointIO(weights_only=weights_only)
    return check_checkpoint(io.load_checkpoint(path, map_location=map_location), path, weights_only)
