"""Lightning's ``utilities.parsing``: AttributeDict, attribute lookup across model, hparams and datamodule,
picklability, and the ``__init__`` arguments read from a frame (what ``save_hyperparameters`` records)."""

from __future__ import annotations

import inspect
import pickle
from argparse import Namespace
from collections.abc import MutableMapping
from typing import Any

from torchfleet.errors import ConfigurationError

__all__ = [
    "AttributeDict", "clean_namespace", "collect_init_args", "get_init_args", "is_picklable", "lightning_getattr",
    "lightning_hasattr", "lightning_setattr", "parse_class_init_keys", "save_hyperparameters",
]


class AttributeDict(dict):
    """A dict whose keys are also attributes (``self.hparams.lr``)."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as exc:
            raise AttributeError(f"No hyperparameter {key!r}; saved ones are: {', '.join(self) or 'none'}.") from exc

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


def is_picklable(obj: object) -> bool:
    """Whether ``pickle.dumps(obj)`` succeeds."""
    try:
        pickle.dumps(obj)
    except Exception:  # a __reduce__ may raise anything (TypeError for a lock, RuntimeError for a ScriptModule)
        return False
    return True


def clean_namespace(hparams: MutableMapping | Namespace) -> None:
    """Remove, in place, the entries of a dict or Namespace whose values cannot be pickled."""
    items = vars(hparams) if isinstance(hparams, Namespace) else hparams
    for key in [k for k, v in items.items() if not is_picklable(v)]:
        del items[key]


def parse_class_init_keys(cls: type) -> tuple[str, str | None, str | None]:
    """The names of ``cls.__init__``'s first parameter, of its ``*args`` and of its ``**kwargs`` (None if absent)."""
    params = list(inspect.signature(cls.__init__).parameters.values())

    def named(kind: Any) -> str | None:
        return next((p.name for p in params if p.kind is kind), None)

    return params[0].name, named(inspect.Parameter.VAR_POSITIONAL), named(inspect.Parameter.VAR_KEYWORD)


def frame_args(frame: Any) -> dict[str, Any]:
    """The named arguments (and expanded ``**kwargs``) of the function running in ``frame``, its first left out."""
    code = frame.f_code
    local = frame.f_locals
    n_named = code.co_argcount + code.co_kwonlyargcount
    names = code.co_varnames[1:n_named]
    values = {n: local[n] for n in names if n in local}
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kw_name = code.co_varnames[n_named + bool(code.co_flags & inspect.CO_VARARGS)]
        values.update(local.get(kw_name, {}))
    return values


def _is_init(frame: Any) -> bool:
    return frame.f_code.co_name == "__init__" and frame.f_code.co_argcount > 0


def get_init_args(frame: Any) -> tuple[Any, dict[str, Any]]:
    """``(self, arguments)`` of the ``__init__`` running in ``frame``; ``(None, {})`` for any other function."""
    if not _is_init(frame):
        return None, {}
    return frame.f_locals.get(frame.f_code.co_varnames[0]), frame_args(frame)


#: Lightning's private name, which its tests import
_get_init_args = get_init_args


def collect_init_args(frame: Any, path_args: list[dict[str, Any]], inside: bool = False,
                      classes: tuple[type, ...] = ()) -> list[dict[str, Any]]:
    """``path_args`` extended with the arguments of each ``__init__`` in the chain of calls that ``frame`` is in
    (innermost first: a parent class's, then its subclass's); frames outside the chain end it. ``classes``, when
    given, keeps only constructors of objects of those classes."""
    while frame is not None:
        if _is_init(frame):
            self, args = get_init_args(frame)
            if not classes or isinstance(self, classes):
                path_args.append(args)
            inside = True
        elif inside:
            break
        frame = frame.f_back
    return path_args


def _holders(model: Any, attribute: str, datamodule: Any = None) -> list[Any]:
    """Where ``attribute`` is found, in the order a later one wins: the model, its hparams, its Trainer's datamodule
    (or ``datamodule``, given before a run has attached one: the tuner) and that datamodule's hparams."""
    found = []
    if datamodule is None:
        trainer = getattr(model, "_trainer", None)
        datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    for owner in (model, datamodule):
        if owner is None:
            continue
        if hasattr(owner, attribute):
            found.append(owner)
        hparams = getattr(owner, "hparams", None)
        if hparams is not None and attribute in hparams:
            found.append(hparams)
    return found


def _missing(attribute: str) -> AttributeError:
    # "is neither stored ..." is Lightning's phrase, which ported tests match
    return AttributeError(f"{attribute!r} is neither stored in the model namespace nor the `hparams` namespace/dict, "
                          "nor the datamodule.")


def lightning_hasattr(model: Any, attribute: str, *, datamodule: Any = None) -> bool:
    """Whether ``attribute`` is on the model, in its hparams, or on (or in the hparams of) its Trainer's datamodule
    (``datamodule``: the one to look in when no Trainer has attached one yet)."""
    return bool(_holders(model, attribute, datamodule))


def lightning_getattr(model: Any, attribute: str, *, datamodule: Any = None) -> Any:
    """``attribute`` from the datamodule if it has one, else from the model's hparams or the model itself."""
    holders = _holders(model, attribute, datamodule)
    if not holders:
        raise _missing(attribute)
    holder = holders[-1]
    return holder[attribute] if isinstance(holder, MutableMapping) else getattr(holder, attribute)


def lightning_setattr(model: Any, attribute: str, value: Any, *, datamodule: Any = None) -> None:
    """Set ``attribute`` everywhere ``lightning_getattr`` could read it, so that every copy agrees."""
    holders = _holders(model, attribute, datamodule)
    if not holders:
        raise _missing(attribute)
    for holder in holders:
        if isinstance(holder, MutableMapping):
            holder[attribute] = value
        else:
            setattr(holder, attribute, value)


def save_hyperparameters(obj: Any, *args: Any, ignore: str | list[str] | None = None, frame: Any = None,
                         given_hparams: dict[str, Any] | None = None) -> None:
    """The function form of ``obj.save_hyperparameters(...)`` (a Module's or DataModule's): the ``__init__`` arguments
    of the constructor that called it (``frame``: another frame to read them from), or ``given_hparams`` as they are."""
    if not callable(getattr(obj, "save_hyperparameters", None)):
        raise ConfigurationError(f"save_hyperparameters(obj) needs a torchfleet Module, DataModule or another "
                                 f"HyperparametersMixin; got a {type(obj).__name__}.")
    if given_hparams is not None:
        obj.save_hyperparameters(dict(given_hparams))
        return
    obj.save_hyperparameters(*args, ignore=ignore, frame=frame or inspect.currentframe().f_back)  # type: ignore[union-attr]
