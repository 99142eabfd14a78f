"""Lightning's ``utilities.compile``: torch.compile'd modules in and out."""

from __future__ import annotations

from typing import Any

from torchfleet.compiled import is_compiled, uncompiled
from torchfleet.errors import ConfigurationError

__all__ = ["from_compiled", "to_uncompiled"]


def from_compiled(model: Any) -> Any:
    """``model`` as the Trainer takes it: the ``torch.compile`` result itself (the Trainer and Fleet compile a compiled
    module's steps in place, so no conversion is needed; Lightning returns the module inside, marked for compiling)."""
    if not is_compiled(model):
        raise ConfigurationError(f"from_compiled expects the result of torch.compile(module); got a "
                                 f"{type(model).__name__}. Pass an uncompiled module to the Trainer as it is.")
    return model


def to_uncompiled(model: Any) -> Any:
    """The module inside a ``torch.compile`` result; anything else as it is."""
    return uncompiled(model)
