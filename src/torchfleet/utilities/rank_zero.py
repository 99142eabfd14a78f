"""Lightning's ``utilities.rank_zero`` names (they live in the leaf module ``torchfleet.rank_zero``)."""

from __future__ import annotations

from torchfleet.rank_zero import *  # noqa: F403
from torchfleet.rank_zero import __all__  # noqa: F401
