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


def not_valid(name: str, value: object, accepted: str, owner: str = "") -> ConfigurationError:
    """The error for an argument value that is not accepted: ``Owner(name=value) is not valid: <accepted>.``

    Without ``owner`` (a Trainer argument) it reads ``name=value is not valid: ...``."""
    given = f"{owner}({name}={value!r})" if owner else f"{name}={value!r}"
    return ConfigurationError(f"{given} is not valid: {accepted.rstrip('.')}.")


def _or_none(text: str, allow_none: bool) -> str:
    return f"{text} or None" if allow_none else text


def _meaning(meaning: str) -> str:
    return f" ({meaning})" if meaning else ""


def check_flag(name: str, value: object, owner: str = "", allow_none: bool = False, meaning: str = "") -> object:
    """``value`` when it is True or False (or None, where allowed), else the one-paragraph error."""
    if isinstance(value, bool) or (value is None and allow_none):
        return value
    raise not_valid(name, value, f"give {_or_none('True or False', allow_none)}{_meaning(meaning)}", owner)


def check_int(name: str, value: object, minimum: int = 0, owner: str = "", allow_none: bool = False,
              meaning: str = "") -> object:
    """``value`` when it is an int >= ``minimum`` (or None, where allowed), else the one-paragraph error."""
    if value is None and allow_none:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return value
    raise not_valid(name, value, f"give {_or_none(f'an int >= {minimum}', allow_none)}{_meaning(meaning)}", owner)


def check_number(name: str, value: object, minimum: float | None = None, owner: str = "", allow_none: bool = False,
                 meaning: str = "") -> object:
    """``value`` when it is a real number (>= ``minimum`` when given; or None, where allowed), else the error."""
    if value is None and allow_none:
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and (
            minimum is None or value >= minimum):
        return value
    what = "a number" if minimum is None else f"a number >= {minimum}"
    raise not_valid(name, value, f"give {_or_none(what, allow_none)}{_meaning(meaning)}", owner)


def check_text(name: str, value: object, owner: str = "", allow_none: bool = False, path: bool = False,
               meaning: str = "") -> object:
    """``value`` when it is a str (or an ``os.PathLike`` where ``path``; or None, where allowed), else the error."""
    import os

    if (value is None and allow_none) or isinstance(value, str) or (path and isinstance(value, os.PathLike)):
        return value
    what = "a path (a str or pathlib.Path)" if path else "a str"
    raise not_valid(name, value, f"give {_or_none(what, allow_none)}{_meaning(meaning)}", owner)
