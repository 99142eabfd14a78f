"""Lightning's ``utilities.seed`` names (both packages): ``isolate_rng`` and the seeding functions, from
``torchfleet.seed``."""

from __future__ import annotations

from torchfleet.seed import (
    isolate_rng,
    max_seed_value,
    min_seed_value,
    pl_worker_init_function,
    reset_seed,
    seed_everything,
)

__all__ = ["isolate_rng", "max_seed_value", "min_seed_value", "pl_worker_init_function", "reset_seed", "seed_everything"]
