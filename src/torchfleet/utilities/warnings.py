"""Lightning's ``utilities.warnings``: ``PossibleUserWarning`` (torchfleet.errors') and turning it off."""

from __future__ import annotations

import warnings

from torchfleet.errors import PossibleUserWarning

__all__ = ["PossibleUserWarning", "disable_possible_user_warnings"]


def disable_possible_user_warnings(module: str = "") -> None:
    """Silence the warnings torchfleet gives about likely (not certain) mistakes, from ``module`` (a regex) or all."""
    warnings.filterwarnings("ignore", category=PossibleUserWarning, module=module)
