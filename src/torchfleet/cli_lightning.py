"""Lightning's ``LightningCLI`` for torchfleet: a LightningCLI program runs after changing its imports.

    from torchfleet.cli import LightningCLI     # was: from lightning.pytorch.cli import LightningCLI

    LightningCLI(MyModel, MyData, save_config_kwargs={"overwrite": True})

gives ``python main.py fit|validate|test|predict`` with ``--trainer.NAME``, ``--model.NAME``, ``--data.NAME``,
``--optimizer``/``--lr_scheduler`` (the model's optimizer chosen on the command line), ``--config``,
``--print_config``, ``--seed_everything`` and ``--ckpt_path``, and writes the configuration to ``config.yaml`` in
the log folder. The constructor's arguments, the attributes (``cli.model``, ``cli.datamodule``, ``cli.trainer``,
``cli.config``) and the methods people override (``add_arguments_to_parser``, ``before_instantiate_classes``,
``instantiate_classes``, ``before_fit``, ``configure_optimizers``, ...) are Lightning 2.6's. Unlike Lightning, a bad
value ends the program with one paragraph and exit status 2 (as ``torchfleet fit`` does), and an optimizer chosen
with ``--optimizer`` is built when the Trainer asks for it, so it holds the parameters fsdp or deepspeed shard.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import yaml
from jsonargparse import ActionConfigFile, Namespace, class_from_function
from torch.optim import Optimizer

from torchfleet.cli_input import explain_build_error, prepare_argv, print_error
from torchfleet.cli_lightning_parser import (
    KEEP_NONE,
    MODEL_CONFIG_KEY,
    ArgsType,
    ConfigExistsError,
    LightningArgumentParser,
    LRSchedulerCallable,
    LRSchedulerType,
    LRSchedulerTypeTuple,
    LRSchedulerTypeUnion,
    OptimizerCallable,
    ReduceLROnPlateau,
    SaveConfigCallback,
    _class_path_adder,
    _with_class_path,
    instantiate_class,
)
from torchfleet.data import DataModule
from torchfleet.errors import ConfigurationError, TorchfleetError
from torchfleet.module import Module
from torchfleet.trainer.trainer import Trainer

__all__ = ["ArgsType", "ConfigExistsError", "LRSchedulerCallable", "LRSchedulerType", "LRSchedulerTypeTuple",
           "LRSchedulerTypeUnion", "LightningArgumentParser", "LightningCLI", "OptimizerCallable",
           "ReduceLROnPlateau", "SaveConfigCallback", "instantiate_class"]


class LightningCLI:
    """A command line for a Module and DataModule: parse the arguments, build the objects, run a Trainer method.

    Args:
        model_class: the Module class (or a function returning one); None: ``--model=pkg.Class`` picks it.
        datamodule_class: the DataModule class (or function); None: ``--data=pkg.Class`` may pick one.
        save_config_callback: the callback class that writes config.yaml (None: none is written).
        save_config_kwargs: its keyword arguments (``{"overwrite": True}``, ``{"config_filename": ...}``).
        trainer_class: the Trainer class (or a function returning one).
        trainer_defaults: defaults for ``--trainer.NAME``; its ``callbacks`` are always added, not configurable.
        seed_everything_default: the seed when ``--seed_everything`` is not given; True: ``seed_everything()``
            picks one (``TF_GLOBAL_SEED``, else 0); False: no seeding.
        parser_kwargs: keyword arguments for every parser, or per subcommand (``{"fit": {"default_env": True}}``).
        parser_class: the parser class (a LightningArgumentParser).
        subclass_mode_model: ``--model`` takes any subclass of ``model_class`` (``--model=pkg.Class
            --model.init_args.x=1``).
        subclass_mode_data: the same for ``--data``.
        args: what to parse instead of ``sys.argv[1:]``: a list of command-line words, or a dict (a config).
        run: True: the first word is a subcommand (fit/validate/test/predict), which runs; False: the objects are
            only built, for the program to use (``cli.trainer.fit(cli.model, datamodule=cli.datamodule)``).
        auto_configure_optimizers: add ``--optimizer`` and ``--lr_scheduler`` (unless ``add_arguments_to_parser``
            added its own); when given, they replace the model's ``configure_optimizers``.
        load_from_checkpoint_support: True: ``--ckpt_path FILE`` builds the model from the configuration recorded
            in FILE by SaveConfigCallback (class path and arguments, nested classes too); False: from the
            hyperparameters ``save_hyperparameters()`` saved there. (Lightning records that configuration in the
            hyperparameters, for ``load_from_checkpoint`` too; here they stay what the model saved.)

    ``--help``, ``--print_config`` and a value jsonargparse rejects end the program as argparse does; a value the
    Trainer or a constructor rejects, and any torchfleet error while the subcommand runs, are printed as one
    paragraph and end it with status 2.
    """

    def __init__(self, model_class: Any = None, datamodule_class: Any = None,
                 save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
                 save_config_kwargs: dict[str, Any] | None = None, trainer_class: Any = Trainer,
                 trainer_defaults: dict[str, Any] | None = None, seed_everything_default: bool | int = True,
                 parser_kwargs: dict[str, Any] | None = None,
                 parser_class: type[LightningArgumentParser] = LightningArgumentParser,
                 subclass_mode_model: bool = False, subclass_mode_data: bool = False, args: ArgsType = None,
                 run: bool = True, auto_configure_optimizers: bool = True,
                 load_from_checkpoint_support: bool = True) -> None:
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = save_config_kwargs or {}
        self.trainer_class = trainer_class
        self.trainer_defaults = trainer_defaults or {}
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = parser_kwargs or {}
        self.parser_class = parser_class
        self.auto_configure_optimizers = auto_configure_optimizers
        self.load_from_checkpoint_support = load_from_checkpoint_support
        self.model_class = model_class
        self._model_class = model_class or Module  # the class the options are read from
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.datamodule_class = datamodule_class
        self._datamodule_class = datamodule_class or DataModule
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data
        self.subcommand: str | None = None
        self.model: Any = None
        self.datamodule: Any = None
        self.trainer: Any = None
        prog = os.path.basename(sys.argv[0]) or "cli"
        try:
            main_kwargs, subcommand_kwargs = self._setup_parser_kwargs(self.parser_kwargs)
            self.setup_parser(run, main_kwargs, subcommand_kwargs)
            self.parse_arguments(self.parser, self._checked(args))
            self._parse_ckpt_path()
            self.subcommand = self.config["subcommand"] if run else None
            self._set_seed()
            self.before_instantiate_classes()
            try:
                self.instantiate_classes()
            except TorchfleetError:
                raise
            except Exception as exc:  # noqa: BLE001 - a constructor rejected a value: one paragraph, no traceback
                raise explain_build_error(exc, builder=LightningCLI) from None
            self.after_instantiate_classes()
            if self.subcommand is not None:
                self._run_subcommand(self.subcommand)
        except TorchfleetError as exc:  # written for users: the message is the whole story
            print_error(prog, exc)
            raise SystemExit(2) from None

    # ------------------------------------------------------------------ the parser
    def _setup_parser_kwargs(self, parser_kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        names = self.subcommands()
        return ({k: v for k, v in parser_kwargs.items() if k not in names},
                {k: v for k, v in parser_kwargs.items() if k in names})

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Create a parser (the main one, and one per subcommand) with ``--config``."""
        import torchfleet

        kwargs.setdefault("dump_header", [f"torchfleet=={torchfleet.__version__}"])
        parser = self.parser_class(**kwargs)
        parser.add_argument("-c", "--config", action=ActionConfigFile,
                            help="a configuration file (YAML or JSON); --print_config writes one to start from")
        return parser

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict[str, Any],
                     subparser_kwargs: dict[str, Any]) -> None:
        """Create the parser with its subcommands (or, for ``run=False``, the options directly)."""
        self.parser = self.init_parser(**main_kwargs)
        if add_subcommands:
            self._subcommand_method_arguments: dict[str, list[str]] = {}
            self._add_subcommands(self.parser, **subparser_kwargs)
        else:
            self._add_arguments(self.parser)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add ``--seed_everything``."""
        parser.add_argument("--seed_everything", type=bool | int, default=self.seed_everything_default,
                            help="seed every random generator with this int before the classes are built; true: "
                                 "seed_everything() picks the seed; false: no seeding")

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add the Trainer's, the model's and the data module's options."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"})
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        # without a data module class, the model's own dataloaders may serve: --data is optional
        parser.add_lightning_class_args(self._datamodule_class, "data", subclass_mode=self.subclass_mode_data,
                                        required=self.datamodule_class is not None)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Override to add options or link them (``parser.link_arguments("data.num_classes", "model.num_classes",
        apply_on="instantiate")``)."""

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:  # unless add_arguments_to_parser added its own
            if not parser._optimizers:
                parser.add_optimizer_args((Optimizer,))
            if not parser._lr_schedulers:
                parser.add_lr_scheduler_args(LRSchedulerTypeTuple)
        self.link_optimizers_and_lr_schedulers(parser)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The subcommands, each with the arguments of its Trainer method that are not options."""
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
            "test": {"model", "dataloaders", "datamodule"},
            "predict": {"model", "dataloaders", "datamodule"},
        }

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}
        subcommands = parser.add_subcommands()
        trainer_class = (self.trainer_class if isinstance(self.trainer_class, type)
                         else class_from_function(self.trainer_class))
        for name in self.subcommands():
            doc = (getattr(trainer_class, name).__doc__ or "").strip()
            description = doc.splitlines()[0] if doc else None
            sub_kwargs = dict(kwargs.get(name, {}))
            sub_kwargs.setdefault("description", description)
            sub = self._prepare_subcommand_parser(trainer_class, name, **sub_kwargs)
            self._subcommand_parsers[name] = sub
            subcommands.add_subcommand(name, sub, help=description)

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = self.init_parser(**kwargs)
        self._add_arguments(parser)
        # the method's other arguments (ckpt_path, verbose, ...) are options, passed to it when it runs
        added = parser.add_method_arguments(klass, subcommand, skip=set(self.subcommands()[subcommand]))
        self._subcommand_method_arguments[subcommand] = added
        return parser

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser: LightningArgumentParser) -> None:
        """Link each optimizer/scheduler group added with a ``link_to`` key to that key."""
        for key, (classes, link_to) in {**parser._optimizers, **parser._lr_schedulers}.items():
            if link_to == "AUTOMATIC":
                continue
            if isinstance(classes, tuple):
                parser.link_arguments(key, link_to)
            else:  # a fixed class: the target gets a class_path too
                parser.link_arguments(key, link_to, compute_fn=_class_path_adder(classes))

    def _checked(self, args: ArgsType) -> ArgsType:
        """The command line with its --model/--data class paths and --config files checked (one paragraph each)."""
        if isinstance(args, (dict, Namespace)):
            return args
        bases = {}
        if self.subclass_mode_model:
            bases["model"] = self._model_class if isinstance(self._model_class, type) else Module
        if self.subclass_mode_data:
            bases["data"] = self._datamodule_class if isinstance(self._datamodule_class, type) else DataModule
        given = list(sys.argv[1:] if args is None else args)
        checked, _ = prepare_argv(given, bases)
        self._rewrote_sys_argv = args is None and checked != given
        return checked if (args is not None or checked != given) else None

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse ``args`` (None: ``sys.argv[1:]``) into ``self.config``."""
        if args is not None and len(sys.argv) > 1 and not getattr(self, "_rewrote_sys_argv", False):
            warnings.warn(f"LightningCLI(args=...) parses {args!r} and ignores the command line's arguments "
                          f"{sys.argv[1:]!r}: give one or the other.", UserWarning, stacklevel=3)
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def _parse_ckpt_path(self) -> None:
        """With ``--ckpt_path FILE``, build the model from the hyperparameters saved in that checkpoint."""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if not ckpt_path or not os.path.isfile(ckpt_path):  # "last", "best" or a sharded folder: nothing to read
            return
        from torchfleet.checkpoint.format import read_checkpoint

        checkpoint = read_checkpoint(ckpt_path, map_location="cpu", weights_only=True)
        recorded = [state[MODEL_CONFIG_KEY] for state in (checkpoint.get("callbacks") or {}).values()
                    if isinstance(state, dict) and MODEL_CONFIG_KEY in state]
        if recorded and self.load_from_checkpoint_support:
            hparams = recorded[0]  # the configuration that built the model, nested classes and all
        else:
            hparams = dict(checkpoint.get("hyper_parameters") or {})
            hparams.pop("_instantiator", None)
            if "_class_path" in hparams:  # written by Lightning
                hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        if not hparams:
            return
        try:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write(f"The hyperparameters saved in {ckpt_path} are not valid options of --model.\n")
            raise

    def _dump_config(self) -> None:
        if hasattr(self, "config_dump"):
            return
        dumped = self.parser.dump(self.config, skip_link_targets=False, format="yaml", **KEEP_NONE)
        self.config_dump = yaml.safe_load(dumped)
        if "subcommand" in self.config:
            self.config_dump = self.config_dump[self.config.subcommand]

    # ------------------------------------------------------------------ building the objects
    def before_instantiate_classes(self) -> None:
        """Override to run code after parsing, before the classes are built (``self.config`` is set)."""

    def instantiate_classes(self) -> None:
        """Build the model, the data module and the Trainer from ``self.config``."""
        # `instantiate` replaced `instantiate_classes` in jsonargparse 4.49; older releases have only the latter
        instantiate = getattr(self.parser, "instantiate", None) or self.parser.instantiate_classes
        self.config_init = instantiate(self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()

    def after_instantiate_classes(self) -> None:
        """Override to run code once ``self.model``, ``self.datamodule`` and ``self.trainer`` exist."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Build the Trainer from its options, ``kwargs`` (they win) and the CLI's callbacks."""
        extra_callbacks = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        trainer_config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        return self._instantiate_trainer(trainer_config, extra_callbacks)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Trainer:
        if "callbacks" not in config:  # a trainer_class without a callbacks argument
            from torchfleet.utilities import rank_zero_warn

            rank_zero_warn(f"{getattr(self.trainer_class, '__qualname__', self.trainer_class)} takes no callbacks "
                           "argument: the CLI's callbacks (config.yaml, --checkpoint-style groups, trainer_defaults' "
                           "callbacks) are left out.")
            return self.trainer_class(**config)
        given = config["callbacks"]
        config["callbacks"] = [] if given is None else list(given) if isinstance(given, list) else [given]
        config["callbacks"] += callbacks
        default = self.trainer_defaults.get("callbacks")
        for callback in (default if isinstance(default, list) else [] if default is None else [default]):
            # a {"class_path": ..., "init_args": ...} default is built here, as the command line's would be
            built = isinstance(callback, dict) and "class_path" in callback
            config["callbacks"].append(instantiate_class((), callback) if built else callback)
        if self.save_config_callback is not None and not config.get("fast_dev_run", False):
            config["callbacks"].append(self.save_config_callback(
                self._parser(self.subcommand), self.config.get(str(self.subcommand), self.config),
                **self.save_config_kwargs))
        return self.trainer_class(**config)

    def _parser(self, subcommand: str | None) -> LightningArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    @staticmethod
    def configure_optimizers(lightning_module: Module, optimizer: Optimizer,
                             lr_scheduler: LRSchedulerTypeUnion | None = None) -> Any:
        """What the model's configure_optimizers returns when ``--optimizer`` (and ``--lr_scheduler``) are given;
        override to return something else."""
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor}}
        return [optimizer], [lr_scheduler]

    def _add_configure_optimizers_method_to_model(self, subcommand: str | None) -> None:
        """Replace the model's configure_optimizers when one optimizer group (and at most one scheduler group)
        were added with "AUTOMATIC" and the command line gave the optimizer."""
        if not self.auto_configure_optimizers:
            return
        parser = self._parser(subcommand)

        def automatic(base: Any, register: dict[str, tuple[Any, str]]) -> list[str]:
            return [key for key, (classes, link_to) in register.items() if link_to == "AUTOMATIC"
                    and any(issubclass(c, base) for c in (classes if isinstance(classes, tuple) else (classes,)))]

        optimizers = automatic(Optimizer, parser._optimizers)
        schedulers = automatic(LRSchedulerTypeTuple, parser._lr_schedulers)
        if not optimizers:
            return
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise ConfigurationError(
                f"{type(self).__name__} can build one optimizer and one LR scheduler for configure_optimizers, but "
                f"{', '.join(optimizers + schedulers)} were all added with link_to='AUTOMATIC'. Link the groups to "
                "model arguments (add_optimizer_args(..., link_to='model.optimizer')) and build them in the model's "
                "configure_optimizers."
            )
        optimizer_class = parser._optimizers[optimizers[0]][0]
        optimizer_init = self._get(self.config_init, optimizers[0])
        if not isinstance(optimizer_class, tuple):
            optimizer_init = _with_class_path(optimizer_class, optimizer_init)
        if not optimizer_init:  # the group exists, the command line did not use it: the model's own method stays
            return
        scheduler_init = None
        if schedulers:
            scheduler_class = parser._lr_schedulers[schedulers[0]][0]
            scheduler_init = self._get(self.config_init, schedulers[0])
            if not isinstance(scheduler_class, tuple):
                scheduler_init = _with_class_path(scheduler_class, scheduler_init)
        if type(self.model).configure_optimizers is not Module.configure_optimizers:
            from torchfleet.utilities import rank_zero_warn

            rank_zero_warn(f"{type(self.model).__name__}.configure_optimizers is replaced by the optimizer given on "
                           f"the command line ({type(self).__name__}.configure_optimizers).")
        optimizer_init = optimizer_init.as_dict() if isinstance(optimizer_init, Namespace) else optimizer_init
        if isinstance(scheduler_init, Namespace):
            scheduler_init = scheduler_init.as_dict()
        self.model.configure_optimizers = partial(_configure_from_command_line, self.model, optimizer_init,
                                                  scheduler_init, self.configure_optimizers)

    def _get(self, config: Namespace, key: str, default: Any = None) -> Any:
        """``config[key]``, looked up inside the subcommand's section when there is one."""
        return config.get(str(self.subcommand), config).get(key, default)

    # ------------------------------------------------------------------ running
    def _run_subcommand(self, subcommand: str) -> None:
        """Run ``before_<subcommand>``, the subcommand (a method of this class of that name, else the Trainer's),
        then ``after_<subcommand>``."""
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        fn = getattr(self, subcommand, getattr(self.trainer, subcommand))
        fn(**self._prepare_subcommand_kwargs(subcommand))
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        """The subcommand's keyword arguments: its options, the model and the data module."""
        kwargs = {k: v for k, v in self.config_init[subcommand].items()
                  if k in self._subcommand_method_arguments[subcommand]}
        kwargs["model"] = self.model
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        return kwargs

    def _set_seed(self) -> None:
        """Seed as ``--seed_everything`` says, and record the seed used in the configuration (config.yaml)."""
        from torchfleet.seed import seed_everything

        seed = self._get(self.config, "seed_everything")
        if seed is False:
            return
        seed = seed_everything(None if seed is True else seed, workers=True)
        (self.config[self.subcommand] if self.subcommand else self.config)["seed_everything"] = seed


def _configure_from_command_line(module: Any, optimizer_init: dict[str, Any], lr_scheduler_init: dict[str, Any] | None,
                                 configure: Callable[..., Any]) -> Any:
    """A model's configure_optimizers when --optimizer chose its optimizer. The optimizer is built when the Trainer
    asks for it, from the parameters it has then (fsdp and deepspeed have sharded them; Lightning builds it when the
    CLI starts, from the unsharded ones). Module-level, so that ddp_spawn can pickle the model."""
    optimizer = instantiate_class(module.parameters(), optimizer_init)
    lr_scheduler = instantiate_class(optimizer, lr_scheduler_init) if lr_scheduler_init else None
    return configure(module, optimizer=optimizer, lr_scheduler=lr_scheduler)
