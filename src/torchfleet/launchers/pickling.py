"""Find what in an object graph does not pickle, by attribute path (for ddp_spawn's pre-flight check)."""

from __future__ import annotations

import pickle
from typing import Any

_MAX_DEPTH = 12


def _try_pickle(obj: Any) -> BaseException | None:
    try:
        pickle.dumps(obj)
    except Exception as exc:  # noqa: BLE001 - any failure to pickle is what we look for
        return exc
    return None


def _children(obj: Any) -> list[tuple[str, Any]]:
    if isinstance(obj, dict):
        return [(f"[{k!r}]", v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    state: Any = None
    getstate = getattr(obj, "__getstate__", None)
    if getstate is not None:
        try:
            state = getstate()
        except Exception:  # noqa: BLE001
            state = None
    if state is None:
        state = getattr(obj, "__dict__", None)
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
        state = {**(state[0] or {}), **state[1]}  # (dict, slots) form
    if not isinstance(state, dict):
        return []
    out = []
    for key, value in state.items():
        if key in ("_modules", "_parameters", "_buffers") and isinstance(value, dict):
            out += [(f".{k}", v) for k, v in value.items()]  # nn.Module submodules read as attributes
        else:
            out.append((f".{key}", value))
    return out


def _describe(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name:
        return "<lambda>" if name.endswith("<lambda>") else f"<{type(obj).__name__} {name}>"
    return f"<{type(obj).__name__}>"


def find_unpicklable(obj: Any, name: str = "obj") -> tuple[str, BaseException] | None:
    """The attribute path of the innermost object in ``obj`` that fails to pickle, and its error; None if all pickles.

    The path reads like ``model.augment -> <lambda>``: the attribute chain from ``name``, then the
    offending object.
    """
    error = _try_pickle(obj)
    if error is None:
        return None
    path, seen = name, {id(obj)}
    for _ in range(_MAX_DEPTH):
        for key, child in _children(obj):
            if id(child) in seen:
                continue
            child_error = _try_pickle(child)
            if child_error is not None:
                seen.add(id(child))
                obj, error, path = child, child_error, path + key
                break
        else:
            break
    return f"{path} -> {_describe(obj)}", error
