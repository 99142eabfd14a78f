"""Hyperparameters: ``save_hyperparameters``, ``hparams`` and ``hparams_initial``, shared by Module and DataModule."""

from __future__ import annotations

import copy
import inspect
import sys
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from torch import nn

from torchfleet.checkpoint.hparams import hold_callables
from torchfleet.errors import ConfigurationError
from torchfleet.utilities.parsing import AttributeDict
from torchfleet.utilities.parsing import frame_args as _init_args


class HyperparametersMixin:
    """``save_hyperparameters``, ``hparams`` and ``hparams_initial``, shared by Module and DataModule."""

    #: whether the Trainer sends these hyperparameters to its loggers: as in Lightning, only once
    #: ``save_hyperparameters()`` was called (and not with ``logger=False``)
    _log_hyperparams: bool = False
    #: the checkpoint entry holding them (Lightning's name for it)
    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"

    @property
    def logs_hparams(self) -> bool:
        """Whether the Trainer sends ``hparams`` to its loggers: once ``save_hyperparameters()`` was called, unless
        with ``logger=False`` (Lightning keeps this in ``_log_hyperparams``, as here)."""
        return bool(self._log_hyperparams)

    @property
    def hparams(self) -> AttributeDict:
        found = self.__dict__.get("_hparams")
        if found is None:  # a subclass whose __init__ did not call ours
            found = AttributeDict()
            object.__setattr__(self, "_hparams", found)
        return found

    @property
    def hparams_initial(self) -> AttributeDict:
        return copy.deepcopy(self.__dict__.get("_hparams_initial") or AttributeDict())

    def save_hyperparameters(
        self, *args: Any, ignore: str | list[str] | None = None, frame: Any = None, logger: bool = True
    ) -> None:
        """Store the ``__init__`` arguments of the calling constructor in ``self.hparams`` (and checkpoints).

        With names as ``args``, store only those (or one dict of values); ``ignore`` lists names to leave out;
        ``logger=False`` keeps them out of the loggers (they are still saved in checkpoints).
        """
        omegaconf = sys.modules.get("omegaconf")
        if len(args) == 1 and omegaconf is not None and isinstance(args[0], omegaconf.DictConfig):
            # a Hydra/OmegaConf config stays one, as Lightning keeps it: self.hparams is that config
            object.__setattr__(self, "_hparams", args[0])
            object.__setattr__(self, "_hparams_initial", copy.deepcopy(args[0]))
            object.__setattr__(self, "_log_hyperparams", logger)
            return
        frame = frame or inspect.currentframe().f_back  # type: ignore[union-attr]
        # every __init__ of this object on the stack contributes (a subclass's arguments override its
        # parent's), so a parent that calls save_hyperparameters() also records the subclass's arguments
        values: dict[str, Any] = {}
        f = frame
        while f is not None:
            if f.f_code.co_name == "__init__" and f.f_locals.get("self") is self:
                values.update(_init_args(f))
            f = f.f_back
        if not values:
            values = _init_args(frame)
        if args:
            if len(args) == 1 and isinstance(args[0], (Mapping, Namespace)):
                # one dict, Namespace (an argparse program's args) or config: its entries are the hyperparameters
                values = dict(vars(args[0]) if isinstance(args[0], Namespace) else args[0])
            else:
                missing = [a for a in args if a not in values]
                if missing:
                    raise ConfigurationError(
                        f"save_hyperparameters({', '.join(map(repr, args))}): {', '.join(missing)} are not "
                        f"arguments of {type(self).__name__}.__init__ (its arguments: {', '.join(values)})."
                    )
                values = {a: values[a] for a in args}
        ignored = [ignore] if isinstance(ignore, str) else list(ignore or [])
        for name in ignored:
            values.pop(name, None)
        for name in list(values):
            if isinstance(values[name], nn.Module):
                values.pop(name)  # modules are weights, not hyperparameters
        self.hparams.update(values)
        hold_callables(values)  # the program holds these: its checkpoints may give them back (checkpoint/hparams.py)
        object.__setattr__(self, "_hparams_initial", copy.deepcopy(AttributeDict(self.hparams)))
        object.__setattr__(self, "_log_hyperparams", logger)

