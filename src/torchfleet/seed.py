"""seed_everything: one seed for Python's, NumPy's and torch's generators, inherited by launched processes."""

from __future__ import annotations

import os
import random

import torch

from torchfleet.errors import ConfigurationError


def seed_everything(seed: int | None = None, workers: bool = False) -> int:
    """Seed Python's, NumPy's and torch's generators (every process alike); returns the seed used."""
    if seed is None:
        env = os.environ.get("TF_GLOBAL_SEED")
        seed = int(env) if env is not None else random.randint(0, 2**31 - 1)
    if not isinstance(seed, int) or not (0 <= seed < 2**32):
        raise ConfigurationError(f"seed={seed!r} is not valid: give an int in [0, 2**32).")
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    # children started by our launchers inherit the seed this way; it is a value, not configuration
    os.environ["TF_GLOBAL_SEED"] = str(seed)
    os.environ["TF_SEED_WORKERS"] = "1" if workers else "0"
    return seed
