"""Lightning's ``utilities.model_helpers``: ``is_overridden`` and ``get_torchvision_model``."""

from __future__ import annotations

from typing import Any

from torch import nn

from torchfleet.errors import ConfigurationError

#: the classes ``is_overridden`` compares with when no parent is given (named, so this module imports none of them)
_BASES = ("torchfleet.module.Module", "torchfleet.data.DataModule", "torchfleet.trainer.callbacks.base.Callback")


def _torchfleet_base(cls: type) -> type | None:
    """Module, DataModule or Callback, whichever ``cls`` derives from."""
    return next((base for base in cls.__mro__ if f"{base.__module__}.{base.__qualname__}" in _BASES), None)


def is_overridden(method_name: str, instance: object | None = None, parent: type | None = None) -> bool:
    """Whether ``instance``'s class defines ``method_name`` differently from ``parent``.

    ``parent`` defaults to the torchfleet class the instance derives from (Module, DataModule or Callback);
    ``instance=None`` answers False, as in Lightning.
    """
    if instance is None:
        return False
    if parent is None:
        parent = _torchfleet_base(type(instance))
        if parent is None:
            raise ConfigurationError(
                f"is_overridden({method_name!r}, ...) got a {type(instance).__name__}, which is no Module, DataModule "
                "or Callback: pass parent=<the base class that defines the method>."
            )
    mine = getattr(type(instance), method_name, None)
    if mine is None:
        return False
    theirs = getattr(parent, method_name, None)
    if theirs is None:
        raise ConfigurationError(
            f"is_overridden({method_name!r}, ...): {parent.__name__} has no method {method_name!r} to be overridden."
        )
    return getattr(mine, "__code__", mine) is not getattr(theirs, "__code__", theirs)


def get_torchvision_model(model_name: str, **kwargs: Any) -> nn.Module:
    """``torchvision.models.get_model(model_name, **kwargs)`` (needs the torchvision package)."""
    try:
        from torchvision import models
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"get_torchvision_model({model_name!r}) needs the torchvision package, which is not installed: "
            "`pip install torchvision`."
        ) from exc
    return models.get_model(model_name, **kwargs)
