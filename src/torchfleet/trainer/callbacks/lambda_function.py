"""LambdaCallback: a callback made of functions, one per hook, without writing a class."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torchfleet.errors import ConfigurationError, closest
from torchfleet.trainer.callbacks.base import Callback

#: the hooks a LambdaCallback can take: every public method of Callback except its state methods
HOOKS = frozenset(
    name for name, _ in inspect.getmembers(Callback, inspect.isfunction)
    if not name.startswith("_") and name not in ("state_dict", "load_state_dict")
)


class LambdaCallback(Callback):
    """``LambdaCallback(on_train_epoch_end=fn, ...)``: each function is called as that hook, with its arguments.

    The Trainer calls only the hooks given (a hook set on an instance counts as overridden).
    """

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        unknown = sorted(set(hooks) - HOOKS)
        if unknown:
            near = [n for name in unknown for n in closest(name, HOOKS, n=1)]
            hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
            raise ConfigurationError(
                f"LambdaCallback got {', '.join(map(repr, unknown))}, which {'is not a hook' if len(unknown) == 1 else 'are not hooks'}."
                f"{hint} Accepted: the Callback hooks {', '.join(sorted(HOOKS))}, each a function or None."
            )
        for name, fn in hooks.items():
            if fn is None:
                continue
            if not callable(fn):
                raise ConfigurationError(
                    f"LambdaCallback({name}={fn!r}) is not callable. Accepted: a function taking the hook's arguments "
                    "(trainer, module, ...), or None."
                )
            setattr(self, name, fn)
