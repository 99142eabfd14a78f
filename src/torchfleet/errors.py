"""Errors raised by torchfleet, each a one-paragraph explanation of what went wrong."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TorchfleetError(Exception):
    """Base class of every error torchfleet raises on purpose."""


class ConfigurationError(TorchfleetError, ValueError):
    """An argument, name or combination of arguments that torchfleet cannot accept."""


class MisconfiguredModuleError(ConfigurationError):
    """The user's Module returned or configured something torchfleet cannot use."""


class MissingEnvironmentVariableError(ConfigurationError, KeyError):
    """A variable the launcher should have set is missing; also a KeyError, as reading ``os.environ`` would raise."""

    def __str__(self) -> str:
        # KeyError would show the paragraph in quotes
        return str(self.args[0]) if self.args else ""


class LauncherSettingsError(ConfigurationError, RuntimeError):
    """The scheduler was asked for a process layout torchfleet cannot run; also a RuntimeError, as in Lightning."""


class PossibleUserWarning(UserWarning):
    """A warning about something that is often a mistake but may be intended (filter it once it is)."""


class CheckpointError(TorchfleetError, ValueError):
    """A checkpoint path that does not exist or a file that is not a torchfleet checkpoint."""


def closest(given: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Return up to ``n`` names from ``choices`` that look most like ``given``."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    found = difflib.get_close_matches(str(given).lower(), list(lowered), n=n, cutoff=0.5)
    return [lowered[f] for f in found]


def unknown_name(kind: str, given: object, choices: Iterable[str], hint: str = "",
                 suggest: Iterable[str] | None = None) -> ConfigurationError:
    """Build the error for an unknown registry name: what was given, the closest names, all names.

    ``suggest`` narrows the "Did you mean" candidates (names that cannot run here are not suggested)."""
    choices = sorted(choices)
    near = closest(str(given), sorted(suggest) if suggest is not None else choices)
    suggestion = f" Did you mean {' or '.join(repr(c) for c in near)}?" if near else ""
    text = (
        f"Unknown {kind} {given!r}.{suggestion} Accepted {kind} names are: "
        f"{', '.join(repr(c) for c in choices)}."
    )
    if hint:
        text += " " + hint
    return ConfigurationError(text)
