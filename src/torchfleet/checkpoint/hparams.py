"""Hyperparameters in checkpoints as plain values, so that safe loading reads them and gives the same objects back.

``save_hyperparameters()`` records whatever ``__init__`` was given: enums, dataclasses, paths,
``argparse.Namespace``, OmegaConf configs. Pickled as they are, a weights-only load refuses them (a
class of the user's is a global to import and call). ``to_plain`` writes each such value as a small
tagged dict of plain values (``{TAG: "enum", "class": "pkg.mod:Color", "name": "RED"}``) that
``torch.load(weights_only=True)`` reads; ``from_plain`` turns them back into the objects.

Giving an object back never imports a module and never runs the class's code: the class must
already be imported (``sys.modules``; the model's own module normally imports it), is looked up in
module and class dicts, must be an Enum, a dataclass or a namedtuple, and is rebuilt as pickle
would (``Color["RED"]``; a dataclass's fields set on ``object.__new__(cls)``, without ``__init__``).
A value whose class is not found stays in its tagged form (``still_plain`` lists those).

Callables (Hydra's ``_partial_: true`` optimizers and schedulers, a model class, a function) are written as their
import path (``{TAG: "callable", "name": "torch.optim.adam:Adam"}``), ``functools.partial`` as its callable plus
its arguments (themselves plain), and an ``nn.Module`` instance (Hydra's ``net``) as its class plus its attributes
(parameters as tensors). Rebuilding a callable does not call it, but the model's constructor may, so a callable is
given back only if it is one of (``trusted_callable``): a class or function of ``torch.nn`` or ``torch.optim``, or a
builtin value type (``float``); one
the program holds in hyperparameters it gave ``save_hyperparameters`` in this process (``hold_callables``: a run's
own checkpoints, and its resume once the model is built again); one the process allowed with
``torch.serialization.add_safe_globals``; or one of the program's own code (``__main__``, or a module whose file
lies outside the Python installation's standard library and site-packages; torchfleet's excluded). Its module must already be imported: nothing is imported from a checkpoint. A file naming any other
imported callable (``os:system``) is refused (``UntrustedCallable``, turned into safe loading's one-paragraph
refusal by the reader); ``trust=True`` (a load with ``weights_only=False``) gives back any imported callable.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import os
import pathlib
import site
import sys
import sysconfig
import types
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

#: the key that marks a tagged value; nobody's hyperparameter dict has it
TAG = "torchfleet.hparam"

_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.Tensor, torch.dtype, torch.device)
_PATHS = {c.__name__: c for c in (pathlib.Path, pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePath,
                                  pathlib.PurePosixPath, pathlib.PureWindowsPath)}


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class UntrustedCallable(Exception):
    """A tagged callable names an imported function or class that ``trusted_callable`` does not accept."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _callable_name(value: Any) -> str | None:
    """``module:qualname`` of a class or function that this name finds again (not a lambda or a local function)."""
    if not isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return None
    name = f"{getattr(value, '__module__', None)}:{getattr(value, '__qualname__', '')}"
    return name if _lookup(name) is value else None


def to_plain(value: Any, pickled: list[str] | None = None, where: str = "hparams") -> Any:
    """``value`` with every enum, dataclass, namedtuple, path, Namespace, frozenset, OmegaConf config, callable,
    ``functools.partial`` and ``nn.Module`` in it replaced by a tagged dict of plain values. What is left as it was
    and will need a trusting load is named in ``pickled`` (``where`` is its position, as ``hparams['act']``)."""
    name = _callable_name(value)
    if name is not None:
        return {TAG: "callable", "name": name}
    if type(value) is functools.partial:
        return {TAG: "partial", "func": to_plain(value.func, pickled, f"{where}.func"),
                "args": [to_plain(v, pickled, f"{where}.args[{i}]") for i, v in enumerate(value.args)],
                "keywords": {k: to_plain(v, pickled, f"{where}.keywords[{k!r}]") for k, v in value.keywords.items()}}
    if isinstance(value, torch.nn.Module) and _callable_name(type(value)) is not None:
        inner: list[str] = []
        state = to_plain(dict(vars(value)), inner, where)
        if not inner:
            return {TAG: "module", "class": _class_name(type(value)), "state": state}
    if isinstance(value, enum.Enum):
        return {TAG: "enum", "class": _class_name(type(value)), "name": value.name}
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return value.item()  # a NumPy scalar (np.float64 is a float too) as the Python number it holds
    if isinstance(value, _PLAIN):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: to_plain(getattr(value, f.name), pickled, f"{where}.{f.name}")
                  for f in dataclasses.fields(value) if hasattr(value, f.name)}
        return {TAG: "dataclass", "class": _class_name(type(value)), "fields": fields}
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        fields = {k: to_plain(v, pickled, f"{where}.{k}") for k, v in zip(type(value)._fields, value)}
        return {TAG: "namedtuple", "class": _class_name(type(value)), "fields": fields}
    if isinstance(value, pathlib.PurePath):
        return {TAG: "path", "class": type(value).__name__, "value": str(value)}
    if isinstance(value, argparse.Namespace):
        return {TAG: "namespace", "value": to_plain(vars(value), pickled, where)}
    if isinstance(value, (set, frozenset)) and (type(value) is frozenset or not all(_plain_key(v) for v in value)):
        # a frozenset is not a value safe loading builds; a set of enums would be a set of dicts
        return {TAG: type(value).__name__, "value": [to_plain(v, pickled, where) for v in value]}
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and isinstance(value, (omegaconf.DictConfig, omegaconf.ListConfig)):
        container = omegaconf.OmegaConf.to_container(value, resolve=False, enum_to_str=False)
        return {TAG: "omegaconf", "value": to_plain(container, pickled, where),
                "struct": bool(omegaconf.OmegaConf.is_struct(value)),
                "readonly": bool(omegaconf.OmegaConf.is_readonly(value))}
    if type(value) in (dict, OrderedDict) and not all(_plain_key(k) for k in value):  # enum keys, say
        return {TAG: "items", "dict": type(value).__name__,
                "value": [[to_plain(k, pickled, where), to_plain(v, pickled, f"{where}[{k!r}]")] for k, v in value.items()]}
    if type(value) in (dict, OrderedDict):
        return type(value)((k, to_plain(v, pickled, f"{where}[{k!r}]")) for k, v in value.items())
    if isinstance(value, Mapping):  # an AttributeDict or another dict type: a dict of the same items
        return {k: to_plain(v, pickled, f"{where}[{k!r}]") for k, v in value.items()}
    if type(value) in (list, tuple, set):
        return type(value)(to_plain(v, pickled, f"{where}[{i}]") for i, v in enumerate(value))
    if pickled is not None:
        pickled.append(f"{where} ({_what(value)})")
    return value


def _plain_key(value: Any) -> bool:
    if type(value) is tuple:
        return all(_plain_key(v) for v in value)
    return isinstance(value, (type(None), bool, int, float, str, bytes)) and not isinstance(value, enum.Enum)


def _what(value: Any) -> str:
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        kind = "the class" if isinstance(value, type) else "the function"
        return f"{kind} {getattr(value, '__module__', '?')}.{value.__qualname__}"
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def from_plain(value: Any, trust: bool = False) -> Any:
    """``value`` with the tagged dicts written by ``to_plain`` turned back into their objects where possible.

    Raises UntrustedCallable for a callable that ``trusted_callable`` refuses, unless ``trust``."""
    if type(value) in (dict, OrderedDict):  # to_plain writes no other mapping; others (a DictConfig) stay as they are
        if value.get(TAG) is not None and type(value) is dict:
            try:
                restored = _restore(value, trust)
            except (TypeError, ValueError, AttributeError):  # a tagged dict damaged or not ours: keep it as it is
                restored = _UNRESOLVED
            return value if restored is _UNRESOLVED else restored
        return type(value)((k, from_plain(v, trust)) for k, v in value.items())
    if type(value) in (list, tuple, set):
        return type(value)(from_plain(v, trust) for v in value)
    return value


def still_plain(value: Any, where: str = "hparams") -> list[str]:
    """Where in ``value`` (after ``from_plain``) a tagged dict remains because its class was not found."""
    if type(value) in (dict, OrderedDict):
        if value.get(TAG) is not None:
            func = value.get("func")
            named = value.get("class") or value.get("name") or (func.get("name") if isinstance(func, dict) else None)
            return [f"{where} (a {value.get(TAG)} of {str(named or '?').replace(':', '.')})"]
        return [p for k, v in value.items() for p in still_plain(v, f"{where}[{k!r}]")]
    if type(value) in (list, tuple, set):
        return [p for i, v in enumerate(value) for p in still_plain(v, f"{where}[{i}]")]
    return []


_UNRESOLVED = object()


def _lookup(name: Any) -> Any:
    """The object ``module:qualname`` if its module is imported; looked up in dicts, so no module code runs."""
    if not isinstance(name, str) or ":" not in name:
        return None
    module, _, qualname = name.partition(":")
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        namespace = getattr(found, "__dict__", None)
        if part == "<locals>" or not isinstance(namespace, Mapping):
            return None
        found = namespace.get(part)
    return found


def _find_class(name: Any) -> type | None:
    found = _lookup(name)
    return found if isinstance(found, type) else None


@functools.lru_cache(maxsize=1)
def _installation_folders() -> tuple[str, ...]:
    """Where the standard library and installed packages live: code there is not the program's own."""
    folders = {sysconfig.get_paths(vars={"base": base, "platbase": base}).get(key)
               for base in {sys.prefix, sys.base_prefix, sys.exec_prefix}
               for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders.update(getattr(site, "getsitepackages", list)())
    folders.add(site.getusersitepackages())
    folders.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # torchfleet's own package
    return tuple(os.path.join(os.path.realpath(f), "") for f in folders if f)


#: builtin types given as hyperparameters (``dtype=float``): building one of their values runs nothing else
_VALUE_TYPES = (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)
#: callables the program holds in its own hyperparameters (``hold_callables``): its checkpoints give them back
_HELD: set[Any] = set()


def hold_callables(value: Any) -> None:
    """Record the top-level callables in ``value`` (hyperparameters given to ``save_hyperparameters``, partials'
    functions and arguments included) as ones this program holds, so that its checkpoints give them back."""
    if _callable_name(value) is not None:
        _HELD.add(value)
    elif type(value) is functools.partial:
        hold_callables([value.func, *value.args, *value.keywords.values()])
    elif isinstance(value, Mapping):
        hold_callables(list(value.values()))
    elif type(value) in (list, tuple, set, frozenset):
        for item in value:
            hold_callables(item)


def trusted_callable(obj: Any, name: str) -> bool:
    """Whether a checkpoint may give back the callable ``obj`` (found as ``name``) without being trusted itself."""
    module = name.partition(":")[0]
    if module.split(".")[:2] in (["torch", "nn"], ["torch", "optim"]) or any(obj is t for t in _VALUE_TYPES):
        return True
    try:
        if obj in _HELD:
            return True
    except TypeError:  # unhashable
        pass
    allowed = torch.serialization.get_safe_globals()
    if any(obj is (entry[0] if isinstance(entry, tuple) else entry) for entry in allowed):
        return True
    if module == "__main__":
        return True
    path = getattr(sys.modules.get(module), "__file__", None)
    return bool(path) and not os.path.realpath(path).startswith(_installation_folders())


def _restore(tagged: Mapping[str, Any], trust: bool) -> Any:
    kind = tagged[TAG]
    if kind == "callable":
        name = str(tagged.get("name"))
        found = _lookup(name)
        if not callable(found) or isinstance(found, types.ModuleType):
            return _UNRESOLVED
        if not trust and not trusted_callable(found, name):
            raise UntrustedCallable(name.replace(":", "."))
        return found
    if kind == "partial":
        func = from_plain(tagged.get("func"), trust)
        if not callable(func):
            return _UNRESOLVED
        return functools.partial(func, *from_plain(list(tagged.get("args", [])), trust),
                                 **from_plain(dict(tagged.get("keywords", {})), trust))
    if kind == "module":
        cls = _find_class(tagged.get("class"))
        if cls is None or not issubclass(cls, torch.nn.Module):
            return _UNRESOLVED
        obj = object.__new__(cls)  # as pickle rebuilds it: no __init__, the attributes set by nn.Module's own code
        torch.nn.Module.__setstate__(obj, from_plain(dict(tagged.get("state", {})), trust))
        return obj
    if kind == "path":
        return _PATHS.get(str(tagged.get("class")), pathlib.Path)(str(tagged.get("value", "")))
    if kind == "namespace":
        return argparse.Namespace(**from_plain(tagged.get("value", {}), trust))
    if kind in ("frozenset", "set"):
        return (frozenset if kind == "frozenset" else set)(from_plain(tagged.get("value", []), trust))
    if kind == "items":
        pairs = ((from_plain(k, trust), from_plain(v, trust)) for k, v in tagged.get("value", []))
        return (OrderedDict if tagged.get("dict") == "OrderedDict" else dict)(pairs)
    if kind == "omegaconf":
        return _restore_omegaconf(tagged, trust)
    cls = _find_class(tagged.get("class"))
    if cls is None:
        return _UNRESOLVED
    if kind == "enum" and issubclass(cls, enum.Enum):
        return cls.__members__.get(tagged.get("name"), _UNRESOLVED)
    fields = {k: from_plain(v, trust) for k, v in dict(tagged.get("fields", {})).items()}
    if kind == "namedtuple" and issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple):
        return tuple.__new__(cls, [fields.get(k) for k in cls._fields])
    if kind == "dataclass" and dataclasses.is_dataclass(cls):
        try:
            obj = object.__new__(cls)
        except TypeError:  # a dataclass over a builtin type needs that type's __new__
            return _UNRESOLVED
        for field in dataclasses.fields(cls):
            if field.name in fields:
                object.__setattr__(obj, field.name, fields[field.name])
            elif field.default is not dataclasses.MISSING:  # a field added since the checkpoint was written
                object.__setattr__(obj, field.name, field.default)
        return obj
    return _UNRESOLVED


def _restore_omegaconf(tagged: Mapping[str, Any], trust: bool) -> Any:
    container = from_plain(tagged.get("value"), trust)
    try:
        from omegaconf import OmegaConf
    except ImportError:  # the plain dict or list it was made of
        return container
    config = OmegaConf.create(container)
    OmegaConf.set_struct(config, bool(tagged.get("struct")))
    OmegaConf.set_readonly(config, bool(tagged.get("readonly")))
    return config
