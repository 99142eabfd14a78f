"""Modules compiled with ``torch.compile``: the module inside, compiling it again, and the names it saves under.

``torch.compile(model)`` returns an ``OptimizedModule`` holding ``model`` as ``_orig_mod``; its
state dict names every tensor ``_orig_mod.<name>``. torchfleet trains, saves and loads the module
inside under its own names, and compiles again with the same settings (``dynamo_ctx``) where the
call runs: Fleet compiles the strategy's wrapper (DDP, fully_shard: torch's recommended order, wrap
first, then compile), the Trainer compiles the module's forward and step methods in place.
Nothing here imports ``torch._dynamo``: a module is recognised by its class.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from torch import nn

log = logging.getLogger(__name__)

#: what ``OptimizedModule.state_dict`` puts before every name
COMPILED_PREFIX = "_orig_mod."
#: the methods the Trainer runs that it compiles (as Lightning does), beside forward
_STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")
_COMPILED_FLAG = "_torchfleet_compiled_with"
_JIT_SCANNING = [False]


@contextmanager
def jit_scan() -> Iterator[None]:
    """While TorchScript scripts or traces a module (``to_torchscript``, TensorBoard's ``add_graph``).

    TorchScript reads every attribute of the module, and ``Module.trainer`` must not raise then."""
    before = _JIT_SCANNING[0]
    _JIT_SCANNING[0] = True
    try:
        yield
    finally:
        _JIT_SCANNING[0] = before


def jit_scanning() -> bool:
    """Whether a ``jit_scan`` is under way."""
    return _JIT_SCANNING[0]


def is_compiled(obj: Any) -> bool:
    """Whether ``obj`` is the wrapper ``torch.compile`` returns for a module."""
    cls = type(obj)
    return cls.__name__ == "OptimizedModule" and cls.__module__.startswith("torch._dynamo") and isinstance(obj, nn.Module)


def uncompiled(obj: Any) -> Any:
    """The module inside a ``torch.compile`` wrapper; anything else as it is."""
    return obj._orig_mod if is_compiled(obj) else obj


def split_compiled(obj: Any) -> tuple[Any, Any]:
    """``(module inside, the compile settings to apply again)``; ``(obj, None)`` for what is not compiled."""
    if is_compiled(obj):
        return obj._orig_mod, obj.dynamo_ctx
    return obj, None


def compile_again(module: nn.Module, settings: Any) -> nn.Module:
    """``module`` compiled with the settings of an earlier ``torch.compile`` (``split_compiled``'s second value)."""
    return settings(module)


def compile_methods_in_place(obj: Any) -> Any:
    """For the Trainer: the module inside ``torch.compile(module)``, with its forward and step methods compiled.

    The module itself is trained (its parameter names stay its own); compiling it again is a no-op.
    Anything not compiled comes back as it is.
    """
    module, settings = split_compiled(obj)
    if settings is None or vars(module).get(_COMPILED_FLAG) is settings:
        return module
    for name in ("forward", *_STEP_METHODS):
        method = getattr(type(module), name, None)
        if callable(method):
            object.__setattr__(module, name, settings(getattr(module, name)))
    object.__setattr__(module, _COMPILED_FLAG, settings)
    return module


def plain_state_dict(module: nn.Module, state: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state`` with the ``_orig_mod.`` that a compiled module saved removed, when ``module`` does not use it.

    Checkpoints written from ``torch.compile(model).state_dict()`` (by an older torchfleet or by
    hand) then load into the plain model. A model with compiled submodules keeps the names it uses.
    """
    if not any(isinstance(k, str) and _has_prefix(k) for k in state):
        return state
    if any(_has_prefix(k) for k in module.state_dict()):
        return state
    log.info("The checkpoint's weights were saved from a torch.compile'd module (names with %r); loading them "
             "under the plain module's names.", COMPILED_PREFIX)
    return {_strip(k) if isinstance(k, str) else k: v for k, v in state.items()}


def _has_prefix(key: str) -> bool:
    return key.startswith(COMPILED_PREFIX) or f".{COMPILED_PREFIX}" in key


def _strip(key: str) -> str:
    key = key[len(COMPILED_PREFIX):] if key.startswith(COMPILED_PREFIX) else key
    return key.replace(f".{COMPILED_PREFIX}", ".")
