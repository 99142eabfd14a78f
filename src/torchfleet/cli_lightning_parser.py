"""The parts of LightningCLI (cli_lightning.py) that Lightning programs also use on their own.

``LightningArgumentParser`` (``add_lightning_class_args``, ``add_optimizer_args``, ``add_lr_scheduler_args``),
``SaveConfigCallback`` (config.yaml in the log folder), the ``ReduceLROnPlateau`` that ``--lr_scheduler`` can name,
the type aliases models annotate their arguments with (``OptimizerCallable``) and ``instantiate_class``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Union

import jsonargparse
import torch
import yaml
from jsonargparse import ArgumentParser, Namespace, class_from_function
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from torchfleet.cli_input import add_trainer_arguments, help_formatter
from torchfleet.data import DataModule
from torchfleet.errors import ConfigurationError, TorchfleetError
from torchfleet.module import Module
from torchfleet.trainer.callbacks.base import Callback
from torchfleet.trainer.trainer import Trainer

try:  # class paths of torch's classes as users write them (torch.optim.Adam, not torch.optim.adam.Adam)
    from jsonargparse import register_unresolvable_import_paths

    register_unresolvable_import_paths(torch)
except ImportError:  # pragma: no cover - older jsonargparse
    pass


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


#: keep None values when writing a configuration (``skip_unset`` replaced ``skip_none`` in jsonargparse 4.49)
KEEP_NONE = {"skip_unset": False} if _version(jsonargparse.__version__) >= (4, 49) else {"skip_none": False}


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ReduceLROnPlateau plus the metric it watches, so that ``--lr_scheduler=ReduceLROnPlateau
    --lr_scheduler.monitor=val_loss`` says everything the Trainer needs."""

    def __init__(self, optimizer: Optimizer, monitor: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, *args, **kwargs)
        self.monitor = monitor


#: the scheduler classes ``--lr_scheduler`` accepts (torch's ReduceLROnPlateau lacks ``monitor``: ours instead)
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = Union[LRScheduler, ReduceLROnPlateau]
LRSchedulerType = Union[type[LRScheduler], type[ReduceLROnPlateau]]
#: types for a model's own constructor arguments (``optimizer: OptimizerCallable = torch.optim.Adam``)
ArgsType = list[str] | dict[str, Any] | Namespace | None
OptimizerCallable = Callable[[Iterable], Optimizer]
LRSchedulerCallable = Callable[[Optimizer], Union[LRScheduler, ReduceLROnPlateau]]

_ClassOrClasses = Union[type, tuple[type, ...]]


class LightningArgumentParser(ArgumentParser):
    """jsonargparse's ArgumentParser plus Lightning's ways of adding a Trainer, Module, DataModule, Callback,
    optimizer or LR scheduler as a group of options.

    Environment variables are read only with ``default_env=True`` (``PL_TRAINER__MAX_EPOCHS=3``, prefix
    ``env_prefix``, "PL" as in Lightning, so job scripts keep working).
    """

    def __init__(self, *args: Any, description: str = "torchfleet Trainer command line tool", env_prefix: str = "PL",
                 default_env: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", help_formatter())
        super().__init__(*args, description=description, env_prefix=env_prefix, default_env=default_env, **kwargs)
        #: the keys whose groups build callbacks the Trainer gets in addition to --trainer.callbacks
        self.callback_keys: list[str] = []
        # which keys hold optimizers and schedulers, and where each is linked to ("AUTOMATIC": configure_optimizers)
        self._optimizers: dict[str, tuple[_ClassOrClasses, str]] = {}
        self._lr_schedulers: dict[str, tuple[_ClassOrClasses, str]] = {}

    def add_lightning_class_args(self, lightning_class: Any, nested_key: str, subclass_mode: bool = False,
                                 required: bool = True) -> list[str]:
        """Add the constructor arguments of a Trainer, Module, DataModule or Callback class (or of a function that
        returns one) as ``--NESTED_KEY.NAME``; with ``subclass_mode``, ``--NESTED_KEY=pkg.Class`` picks any subclass.
        Returns the names added."""
        if callable(lightning_class) and not isinstance(lightning_class, type):
            lightning_class = class_from_function(lightning_class)
        bases = (Trainer, Module, DataModule, Callback)
        if not (isinstance(lightning_class, type) and issubclass(lightning_class, bases)):
            raise ConfigurationError(
                f"add_lightning_class_args({lightning_class!r}, {nested_key!r}): give a subclass of torchfleet's "
                "Trainer, Module, DataModule or Callback (the class, not an instance), or a function whose return "
                "annotation is one of them."
            )
        if issubclass(lightning_class, Callback):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            return self.add_subclass_arguments(lightning_class, nested_key, fail_untyped=False, required=required)
        if issubclass(lightning_class, Trainer):  # built by LightningCLI.instantiate_trainer, with the callbacks
            return add_trainer_arguments(self, lightning_class, nested_key, instantiate=False)
        return self.add_class_arguments(lightning_class, nested_key, fail_untyped=False, sub_configs=True)

    def add_optimizer_args(self, optimizer_class: _ClassOrClasses = (Optimizer,), nested_key: str = "optimizer",
                           link_to: str = "AUTOMATIC") -> None:
        """Add an optimizer class's arguments as ``--NESTED_KEY.NAME`` (a tuple: any subclass, ``--NESTED_KEY=Adam``).

        ``link_to``: the key of a model argument that receives it, or "AUTOMATIC": the model's
        ``configure_optimizers`` is replaced by one that builds it."""
        self._add_optim_group(optimizer_class, nested_key, link_to, Optimizer, "params", self._optimizers)

    def add_lr_scheduler_args(self, lr_scheduler_class: Any = LRSchedulerTypeTuple, nested_key: str = "lr_scheduler",
                              link_to: str = "AUTOMATIC") -> None:
        """Add an LR scheduler class's arguments as ``--NESTED_KEY.NAME``, as ``add_optimizer_args`` does."""
        self._add_optim_group(lr_scheduler_class, nested_key, link_to, LRSchedulerTypeTuple, "optimizer",
                              self._lr_schedulers)

    def _add_optim_group(self, classes: _ClassOrClasses, key: str, link_to: str, base: Any, first: str,
                         register: dict[str, tuple[_ClassOrClasses, str]]) -> None:
        given = classes if isinstance(classes, tuple) else (classes,)
        if not all(isinstance(c, type) and issubclass(c, base) for c in given):
            names = base.__name__ if isinstance(base, type) else " or ".join(b.__name__ for b in base)
            raise ConfigurationError(f"--{key} takes {names} classes; {classes!r} is not one (give the class, or a "
                                     "tuple of classes to accept their subclasses).")
        # built by the caller (configure_optimizers), who has the parameters or the optimizer: not instantiated here
        kwargs: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": {first}}
        if isinstance(classes, tuple):
            self.add_subclass_arguments(classes, key, **kwargs)
        else:
            self.add_class_arguments(classes, key, sub_configs=True, **kwargs)
        register[key] = (classes, link_to)


#: the entry of SaveConfigCallback's checkpoint state that holds the model's configuration
MODEL_CONFIG_KEY = "model_config"


class ConfigExistsError(TorchfleetError, RuntimeError):
    """A run would overwrite the config.yaml of an earlier run in the same log folder."""


class SaveConfigCallback(Callback):
    """Write the configuration a LightningCLI run was given to ``config.yaml`` in the log folder, on global rank 0.

    Args:
        parser: the parser that read the configuration.
        config: the configuration to write.
        config_filename: the file's name.
        overwrite: replace a file an earlier run wrote there (without it, the run stops with an error).
        multifile: keep the structure of several config files given on the command line.
        save_to_log_dir: False writes nothing to the log folder (for subclasses whose ``save_config`` saves it
            elsewhere).
    """

    def __init__(self, parser: LightningArgumentParser, config: Namespace, config_filename: str = "config.yaml",
                 overwrite: bool = False, multifile: bool = False, save_to_log_dir: bool = True) -> None:
        self.parser = parser
        self.config = config
        self.config_filename = config_filename
        self.overwrite = overwrite
        self.multifile = multifile
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False
        self._model_config: dict[str, Any] | None = None
        if not save_to_log_dir and type(self).save_config is SaveConfigCallback.save_config:
            raise ConfigurationError(
                "SaveConfigCallback(save_to_log_dir=False) would save the configuration nowhere: subclass it and "
                "implement save_config(trainer, pl_module, stage) to save it elsewhere."
            )

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.already_saved:  # a later stage of the same Trainer (fit then test)
            return
        if self.save_to_log_dir:
            log_dir = trainer.log_dir  # the same folder on every rank: the loggers agreed on rank 0's version
            config_path = os.path.join(log_dir, self.config_filename)
            if not self.overwrite:
                # rank 0 looks; every rank stops alike, or the others would wait for rank 0 forever
                exists = trainer.strategy.broadcast(os.path.isfile(config_path) if trainer.is_global_zero else False)
                if exists:
                    raise ConfigExistsError(
                        f"{config_path} already exists: it holds the configuration of an earlier run in this log "
                        "folder, and this run stops rather than overwrite it. Delete it, log to another folder, pass "
                        "LightningCLI(save_config_kwargs={'overwrite': True}) to overwrite it, or "
                        "LightningCLI(save_config_callback=None) to save no configuration."
                    )
            if trainer.is_global_zero:
                os.makedirs(log_dir, exist_ok=True)  # no logger has written there yet
                self.parser.save(self.config, config_path, overwrite=self.overwrite, multifile=self.multifile,
                                 **KEEP_NONE)
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)

    def state_dict(self) -> dict[str, Any]:
        """The model's section of the configuration as parsed (class path and arguments, nested classes too), kept
        in checkpoints so that ``--ckpt_path FILE`` builds the same model (Lightning keeps it in the
        hyperparameters). Plain YAML values: a weights-only load reads them."""
        if self._model_config is None:
            dumped = self.parser.dump(self.config, skip_link_targets=False, format="yaml", **KEEP_NONE)
            self._model_config = (yaml.safe_load(dumped) or {}).get("model") or {}
        return {MODEL_CONFIG_KEY: self._model_config} if self._model_config else {}

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Override to save the configuration somewhere else too (a logger's hyperparameters). Runs on global rank 0
        only: a collective here would wait for the other ranks forever."""


def instantiate_class(args: Any, init: dict[str, Any]) -> Any:
    """Build ``init["class_path"]`` with ``args`` (one value or a tuple) first and ``init["init_args"]`` after."""
    import importlib

    module_name, _, class_name = init["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(*(args if isinstance(args, tuple) else (args,)), **init.get("init_args", {}))


def _with_class_path(cls: type, init_args: Any = None) -> dict[str, Any]:
    if isinstance(init_args, Namespace):
        init_args = init_args.as_dict()
    return {"class_path": f"{cls.__module__}.{cls.__name__}", "init_args": init_args or {}}


def _class_path_adder(cls: type) -> Callable[[Any], dict[str, Any]]:
    return partial(_with_class_path, cls)
