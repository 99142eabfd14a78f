"""Lightning's ``utilities.seed`` names: ``isolate_rng`` (and the seeding functions, from ``torchfleet.seed``)."""

from __future__ import annotations

from torchfleet.seed import isolate_rng, reset_seed, seed_everything

__all__ = ["isolate_rng", "seed_everything", "reset_seed"]
