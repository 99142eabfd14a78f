"""The ``torchfleet`` command: fit/validate/test/predict a Module from the command line, list strategies.

    torchfleet fit                                    # the bundled addition example
    torchfleet fit --model pkg.mod.MyModel --data pkg.mod.MyData --trainer.max_epochs=10 --model.lr=1e-3
    torchfleet fit --model models/net.py:Net --seed 1    # a class in a file
    torchfleet fit --config run.yaml --trainer.devices=2
    torchfleet fit --print_config > run.yaml          # the resolved configuration, to edit and reuse
    torchfleet strategies                             # the registered strategies
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from torchfleet.cli_input import (
    add_trainer_arguments,
    check_config_files,
    explain_build_error,
    help_formatter,
    listing_mode,
    prepare_argv,
    print_error,
    usage_error,
)
from torchfleet.errors import ConfigurationError

if TYPE_CHECKING:
    from torchfleet.strategies.strategy import Strategy

EXAMPLE_MODEL = "torchfleet.examples.addition.AdditionTransformer"
EXAMPLE_DATA = "torchfleet.examples.addition.AdditionData"
STAGES = ("fit", "validate", "test", "predict")

_HELP = """usage: torchfleet <command> [options]

commands:
  fit           train a model (without --model: the bundled addition example)
  validate      run the validation loop once
  test          run the test loop once
  predict       run predict_step over the predict data
  strategies    list the registered strategies (--explain, with fit's options: what strategy='auto' picks)
  estimate      memory per rank of each candidate strategy, before launching (fit's options, --device-memory)
  accelerators  list the registered accelerators
  consolidate   write a checkpoint of any strategy (fsdp/deepspeed shards too) as one torch.load-able file
  run           start the processes of a Fleet script: torchfleet run train.py --devices 2 --strategy ddp

options:
  -h, --help     show this message
  -V, --version  show torchfleet's version

`torchfleet <command> --help` lists a command's options: every Trainer argument as
--trainer.NAME, the model's as --model.NAME, the data module's as --data.NAME, plus
--config FILE.yaml, --print_config, --seed N and --ckpt_path PATH|last.
"""

log = logging.getLogger("torchfleet")


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    # the last column is left ragged: descriptions vary a lot in length
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join([*(f"{c:<{w}}" for c, w in zip(row, widths)), row[-1]])

    return "\n".join(line(r) for r in [header, *rows])


def _strategy_unavailable(cls: type[Strategy]) -> str:
    """Whether a strategy class can run on this machine: "yes", or "no: " and why."""
    import torch

    from torchfleet.utilities.imports import package_available

    if cls.requires_package is not None and not package_available(cls.requires_package):
        return f"no: {cls.requires_package} is not installed (pip install {cls.requires_package})"
    why = cls.unusable_here(torch.cuda.is_available())
    return "yes" if why is None else f"no: {why}"


def _list_registry(kind: str, help_only: bool = False) -> int:
    if help_only:
        print(f"usage: torchfleet {kind}\n\nList the registered {kind}: name, class, whether it can run on this machine "
              "(and why not), description." + ("\n`torchfleet strategies --explain [fit's options]`: what "
                                               "strategy='auto' picks for that run." if kind == "strategies" else ""))
        return 0
    if kind == "strategies":
        from torchfleet.strategies.registry import StrategyRegistry as registry

        def usable(cls: type) -> str:
            return _strategy_unavailable(cls)
    else:
        from torchfleet.accelerators.registry import AcceleratorRegistry as registry

        def usable(cls: type) -> str:
            return "yes" if cls.is_available() else "no: not present on this machine"
    registry.load_entry_points()
    reasons: list[str] = []  # each reason once, as a numbered note under the table
    rows = []
    for e in registry.entries():
        why = usable(e.cls)
        mark = "yes"
        if why != "yes":
            why = why.removeprefix("no: ")
            if why not in reasons:
                reasons.append(why)
            mark = f"no [{reasons.index(why) + 1}]"
        rows.append((e.name, e.cls.__name__, mark, e.description))
    print(_table(rows, ("name", "class", "usable", "description")))
    for n, why in enumerate(reasons, 1):
        print(f"[{n}] {why}")
    return 0


def _parser(stage: str, example: bool, model_class: type | None = None, datamodule_class: type | None = None,
            prog: str = "torchfleet", trainer_defaults: dict[str, Any] | None = None,
            seed_default: int | None = None) -> Any:
    """The parser of one stage. ``model_class``/``datamodule_class`` fix the classes (``CLI(MyModel, MyData)``:
    ``--model.NAME`` are that class's arguments); without them ``--model``/``--data`` take a class path."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    from torchfleet.data import DataModule
    from torchfleet.module import Module
    from torchfleet.trainer.trainer import Trainer

    parser = ArgumentParser(
        prog=f"{prog} {stage}",
        description=f"{prog} {stage}: Trainer.{stage} from the command line.",
        formatter_class=help_formatter(),
    )
    parser.add_argument("--config", action=ActionConfigFile,
                        help="a YAML file with trainer:, model:, data:, seed_everything:, ckpt_path: sections")
    parser.add_argument("--seed_everything", "--seed", type=int | None, default=0 if example else seed_default,
                        help="seed every random generator with this value (null: do not seed)")
    parser.add_argument("--ckpt_path", type=str | None, default=None,
                        help="checkpoint to load: a path, 'last' (the newest; fit resumes the run) or 'best'")
    add_trainer_arguments(parser, Trainer, "trainer")
    if model_class is not None:
        parser.add_class_arguments(model_class, "model", help=f"the arguments of {model_class.__name__}")
    else:
        parser.add_subclass_arguments(Module, "model", required=True,
                                      help="the Module class ('pkg.module.Class' or 'file.py:Class') and its arguments")
    if datamodule_class is not None:
        parser.add_class_arguments(datamodule_class, "data", help=f"the arguments of {datamodule_class.__name__}")
    elif model_class is None:
        parser.add_subclass_arguments(DataModule, "data", required=False, help="the DataModule class and its arguments")
    if example:
        from torchfleet.examples import addition

        parser.set_defaults({"model": {"class_path": EXAMPLE_MODEL}, "data": {"class_path": EXAMPLE_DATA}})
        trainer_defaults = {**addition.default_trainer_kwargs(), **(trainer_defaults or {})}
    if trainer_defaults:
        parser.set_defaults({f"trainer.{k}": v for k, v in trainer_defaults.items()})
    return parser


def _example_help() -> str:
    """The bundled example's --model.NAME and --data.NAME options, for `torchfleet fit --help`."""
    from jsonargparse import ArgumentParser

    from torchfleet.examples.addition import AdditionData, AdditionTransformer

    sub = ArgumentParser(formatter_class=help_formatter(), add_help=False)
    sub.add_class_arguments(AdditionTransformer, "model")
    sub.add_class_arguments(AdditionData, "data")
    groups = sub.format_help().split("\n\n", 1)[-1]  # drop the usage line
    # the sections' own "--model CONFIG" entries: in `fit`, --model takes a class, not a config file
    groups = "\n".join(line for line in groups.splitlines() if not line.startswith(("  --model CONFIG", "  --data CONFIG")))
    return ("\nWithout --model, the bundled example is trained (torchfleet.examples.addition); its options:\n\n"
            + groups)


def _last_per_epoch(rows: list[dict[str, str]], key: str) -> list[tuple[int, float]]:
    by_epoch: dict[int, float] = {}
    for r in rows:
        if r.get(key) and r.get("epoch"):
            by_epoch[int(float(r["epoch"]))] = float(r[key])
    return sorted(by_epoch.items())


def _metric_rows(log_dir: str) -> tuple[list[dict[str, str]], list[str]] | None:
    """The logged values as metrics.csv's rows and columns: from metrics.csv (CSVLogger), else from TensorBoard's
    event files (TensorBoardLogger, the default logger when tensorboard is installed); None when neither is there."""
    metrics_file = os.path.join(log_dir, "metrics.csv")
    if os.path.isfile(metrics_file):
        import csv

        with open(metrics_file, newline="") as f:
            reader = csv.DictReader(f)
            return list(reader), list(reader.fieldnames or [])
    if not any(name.startswith("events.out.tfevents") for name in os.listdir(log_dir)):
        return None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(log_dir)
    events.Reload()
    tags = events.Tags().get("scalars", [])
    by_step: dict[int, dict[str, str]] = {}
    for tag in tags:
        for event in events.Scalars(tag):
            value = event.value  # written as metrics.csv writes it: an epoch as "1", a loss in full
            by_step.setdefault(event.step, {"step": str(event.step)})[tag] = (
                str(int(value)) if value.is_integer() else repr(value))
    return [by_step[step] for step in sorted(by_step)], ["step", *tags]


def _plot(log_dir: str) -> str | None:
    """Write loss_curve.png in the log folder: training loss by step, validation metrics by epoch."""
    table = _metric_rows(log_dir) if os.path.isdir(log_dir) else None
    if table is None:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("No loss curve written: `pip install matplotlib` (or torchfleet[plot]) enables it.")
        return None
    fig = _loss_figure(*table)
    if fig is None:
        return None
    path = os.path.join(log_dir, "loss_curve.png")
    # bbox_inches="tight" keeps the legends below the panels inside the image
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _legend_below(ax: Any, handles: list[Any]) -> None:
    # under the panel, outside the data: a legend inside may cover the curves (twin axes make "best" blind
    # to the other axis's lines)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(len(handles), 3),
              frameon=False)


def _loss_figure(rows: list[dict[str, str]], columns: list[str]) -> Any:
    """The figure of metrics.csv's rows: training losses by step (log scale when positive); validation
    losses by epoch (integer ticks) with accuracy-like metrics (all in [0, 1]) on a 0-100 % axis."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter, MaxNLocator, PercentFormatter

    train_keys = [k for k in columns if "loss" in k and not k.startswith(("val", "test", "predict"))]
    val_keys = [k for k in columns if k.startswith("val")]
    if not train_keys and not val_keys:
        return None
    panels = int(bool(train_keys)) + int(bool(val_keys))
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.8), squeeze=False)
    ax_iter = iter(axes[0])
    if train_keys:
        ax = next(ax_iter)
        values = []
        for key in train_keys:
            points = [(int(float(r["step"])), float(r[key])) for r in rows if r.get(key)]
            if points:
                ax.plot(*zip(*points), label=key)
                values += [v for _, v in points]
        if values and min(values) > 0:
            ax.set_yscale("log")  # a loss falls by orders of magnitude: the late steps stay readable
            # plain numbers (0.5, 2), not 5x10^-1; minor ticks labelled only where a decade has few ticks
            ax.yaxis.set_major_formatter(LogFormatter())
            ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        ax.set(xlabel="step", ylabel="loss" + (" (log scale)" if ax.get_yscale() == "log" else ""), title="training")
        _legend_below(ax, ax.get_legend_handles_labels()[0])
    if val_keys:
        ax = next(ax_iter)
        losses = [k for k in val_keys if "loss" in k]
        others = [k for k in val_keys if k not in losses]
        # accuracy-like metrics live on [0, 1]; a second y axis keeps a large loss from flattening them
        ax_right = ax.twinx() if losses and others else ax
        other_values: list[float] = []
        for n, key in enumerate(losses + others):
            target = ax if key in losses else ax_right
            points = _last_per_epoch(rows, key)
            if points:
                # explicit colours: a twin axis would restart the colour cycle
                target.plot(*zip(*points), "o-" if key in losses else "s--", label=key, color=f"C{n}")
                if key in others:
                    other_values += [v for _, v in points]
        if losses:
            ax.set_ylabel(", ".join(losses))
        if others:
            ax_right.set_ylabel(", ".join(others))
            if other_values and 0.0 <= min(other_values) and max(other_values) <= 1.0:
                ax_right.set_ylim(0.0, 1.0)
                ax_right.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        ax.set(xlabel="epoch", title="validation")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        handles = [h for a in dict.fromkeys([ax, ax_right]) for h in a.get_legend_handles_labels()[0]]
        if handles:
            _legend_below(ax, handles)
    fig.tight_layout()
    return fig


def _run_stage(stage: str, argv: list[str], model_class: type | None = None, datamodule_class: type | None = None,
               prog: str = "torchfleet", trainer_defaults: dict[str, Any] | None = None,
               seed_default: int | None = None, sink: dict[str, Any] | None = None, run: bool = True,
               bundled_example: bool = True) -> int:
    """Parse ``argv`` for ``stage``, build the Trainer, model and data, run the stage (unless ``run`` is False).
    Shared by the ``torchfleet`` command and ``CLI(...)``; ``sink`` receives the built objects and the config.
    Without ``model_class`` and without --model, the bundled example is trained if ``bundled_example``."""
    # `torchfleet` is a console script, so the user's directory is not on sys.path as it is for
    # `python -m torchfleet`: put it there, so that --model mymodels.Net finds ./mymodels.py.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    example = False
    if model_class is None:
        argv, example = prepare_argv(argv)
        example = example and bundled_example
    else:
        check_config_files(argv)
    from jsonargparse import ArgumentError

    parser = _parser(stage, example, model_class, datamodule_class, prog, trainer_defaults, seed_default)
    if example and any(a in ("-h", "--help") for a in argv):
        parser.print_help()
        print(_example_help(), end="")
        return 0
    parser.exit_on_error = False  # a usage error is raised, and shown as one paragraph (usage_error)
    try:
        cfg = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --print_config
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except ArgumentError as exc:
        raise usage_error(f"{prog} {stage}", str(exc)) from None
    if cfg.seed_everything is not None:
        from torchfleet.seed import seed_everything

        seed_everything(cfg.seed_everything)
    # `instantiate` replaced `instantiate_classes` in jsonargparse 4.49; older releases have only the latter
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    try:
        objects = instantiate(cfg)
    except Exception as exc:  # noqa: BLE001 - a constructor's own check rejected a value: one paragraph, no traceback
        raise explain_build_error(exc) from None
    trainer, model, data = objects.trainer, objects.model, objects.get("data")
    if sink is not None:
        sink.update(config=cfg, trainer=trainer, model=model, datamodule=data)
    if not run:
        return 0
    ckpt_path = _checkpoint_to_load(trainer, stage, cfg.ckpt_path)
    result = getattr(trainer, stage)(model, datamodule=data, ckpt_path=ckpt_path)
    if sink is not None:
        sink["result"] = result
    if stage == "fit" and trainer.is_global_zero:
        _report(trainer)
    return 0


def _checkpoint_to_load(trainer: Any, stage: str, ckpt_path: str | None) -> str | None:
    """Resolve --ckpt_path (a path, 'last', 'best') and say which file is loaded; a resumed fit logs on in the
    version folder of the run it resumes (logs/version_0 again, not a new version_1)."""
    if ckpt_path is None:
        return None
    from torchfleet.trainer.checkpointing import resolve_ckpt_path

    path = resolve_ckpt_path(trainer, ckpt_path, stage)
    if path is None:  # 'last' found nothing: resolve_ckpt_path warned, the run starts fresh
        return None
    resumed_in = []
    if stage == "fit":
        for lg in trainer.loggers:
            if getattr(lg, "use_version_of", None) is not None and lg.use_version_of(path):
                resumed_in.append(lg.log_dir)
    if trainer.is_global_zero:
        what = "Resuming from" if stage == "fit" else "Loading weights from"
        print(f"{what} {path}" + (f"; logging on in {', '.join(resumed_in)}" if resumed_in else ""), flush=True)
    return path


def _report(trainer: Any) -> None:
    metrics = {}
    for k, v in trainer.callback_metrics.items():
        try:
            metrics[k] = float(v)
        except (TypeError, ValueError, RuntimeError):  # a non-scalar metric is not shown
            pass
    shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()))
    print(f"Finished: epoch {trainer.current_epoch}, step {trainer.global_step}" + (f"; {shown}" if shown else ""))
    parts = []
    if trainer.loggers:
        plot = _plot(trainer.log_dir)
        parts.append(f"Logs: {trainer.log_dir}" + (" (loss_curve.png)" if plot else ""))
    ck = trainer.checkpoint_callback
    if ck is not None and (ck.best_model_path or ck.last_model_path):
        parts.append(f"best checkpoint: {ck.best_model_path or ck.last_model_path}")
    if parts:
        print("; ".join(parts))


class CLI:
    """A command line for your own Module and DataModule, as Lightning's ``LightningCLI``::

        # train.py
        from torchfleet.cli import CLI

        if __name__ == "__main__":
            CLI(MyModel, MyDataModule)

    then ``python train.py fit --model.hidden=64 --data.batch_size=32 --trainer.max_epochs=2``; also
    ``validate``, ``test`` and ``predict``, ``--config run.yaml``, ``--print_config`` (the resolved configuration,
    to save and reuse), ``--seed N``, ``--ckpt_path PATH|last|best`` and ``--help`` (every option, described).
    The same parser as ``torchfleet fit`` builds the objects: ``--model.NAME`` are ``model_class``'s constructor
    arguments, ``--data.NAME`` the data module's, ``--trainer.NAME`` the Trainer's. Without ``model_class``,
    ``--model pkg.module.Class`` (or ``file.py:Class``) picks the class, as in ``torchfleet fit``.

    Args:
        model_class: the Module class to build, or None to take it from ``--model``.
        datamodule_class: the DataModule class to build; None: ``--data`` may name one (or the model
            provides its dataloaders).
        args: the arguments to parse instead of ``sys.argv[1:]``.
        run: with True, the first argument is the subcommand and the stage runs; with False, there is no
            subcommand: the objects are built (``cli.trainer``, ``cli.model``, ``cli.datamodule``) for you to use.
        trainer_defaults: default values for Trainer arguments (the command line overrides them).
        seed_everything_default: the seed used when ``--seed`` is not given (None: do not seed).

    A usage error, ``--help`` and ``--print_config`` end the program (``SystemExit``), as with argparse; a
    torchfleet error is printed as one paragraph and ends it with status 2. ``LightningCLI`` (in this module too)
    is Lightning's fuller API, for programs ported from Lightning: config.yaml, subclass mode, ``--optimizer``.
    """

    def __init__(self, model_class: type | None = None, datamodule_class: type | None = None, *,
                 args: list[str] | None = None, run: bool = True, trainer_defaults: dict[str, Any] | None = None,
                 seed_everything_default: int | None = None) -> None:
        from torchfleet.errors import TorchfleetError

        self.trainer: Any = None
        self.model: Any = None
        self.datamodule: Any = None
        self.config: Any = None
        self.result: Any = None
        argv = list(sys.argv[1:] if args is None else args)
        prog = os.path.basename(sys.argv[0]) or "cli"
        self.subcommand = None
        if run:
            if not argv or argv[0] not in STAGES:
                given = f"unknown subcommand {argv[0]!r}. " if argv and not argv[0].startswith("-") else ""
                wants_help = bool(argv) and argv[0] in ("-h", "--help")
                print(f"usage: {prog} {{{','.join(STAGES)}}} [options]\n{given if not wants_help else ''}"
                      f"Give a subcommand: {', '.join(STAGES)}; `{prog} fit --help` lists the options.",
                      file=sys.stdout if wants_help else sys.stderr)
                raise SystemExit(0 if wants_help else 2)
            self.subcommand, argv = argv[0], argv[1:]
        from torchfleet.data import DataModule
        from torchfleet.module import Module

        for kind, cls, base in (("model_class", model_class, Module), ("datamodule_class", datamodule_class, DataModule)):
            if cls is not None and not (isinstance(cls, type) and issubclass(cls, base)):
                raise ConfigurationError(
                    f"CLI({kind}={cls!r}): give a subclass of torchfleet.{base.__name__} (the class itself, not an "
                    "instance); its constructor's arguments become command-line options."
                )
        sink: dict[str, Any] = {}
        try:
            code = _run_stage(self.subcommand or "fit", argv, model_class, datamodule_class, prog, trainer_defaults,
                              seed_everything_default, sink, run=run, bundled_example=False)
        except TorchfleetError as exc:
            print_error(prog, exc)
            raise SystemExit(2) from None
        if "trainer" not in sink:  # --help, --print_config or a usage error: nothing was built
            raise SystemExit(code)
        self.config, self.trainer, self.model = sink["config"], sink["trainer"], sink["model"]
        self.datamodule, self.result = sink["datamodule"], sink.get("result")


#: Lightning's names, in modules of their own: importing them loads the Trainer and jsonargparse, which the
#: `torchfleet strategies` command does not need
_LIGHTNING_NAMES = {
    "LightningCLI": "torchfleet.cli_lightning", "LightningArgumentParser": "torchfleet.cli_lightning_parser",
    "SaveConfigCallback": "torchfleet.cli_lightning_parser", "ReduceLROnPlateau": "torchfleet.cli_lightning_parser",
    "instantiate_class": "torchfleet.cli_lightning_parser", "ArgsType": "torchfleet.cli_lightning_parser",
    "OptimizerCallable": "torchfleet.cli_lightning_parser", "LRSchedulerCallable": "torchfleet.cli_lightning_parser",
    "LRSchedulerTypeTuple": "torchfleet.cli_lightning_parser", "LRSchedulerTypeUnion": "torchfleet.cli_lightning_parser",
    "LRSchedulerType": "torchfleet.cli_lightning_parser",
}


def __getattr__(name: str) -> Any:
    module = _LIGHTNING_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'torchfleet.cli' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> int:
    """Run the ``torchfleet`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    from torchfleet.errors import TorchfleetError

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_HELP, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        import torchfleet

        if len(argv) > 1:
            print(f"torchfleet: error: unrecognized arguments: {' '.join(argv[1:])}. `torchfleet {argv[0]}` takes "
                  "none.", file=sys.stderr)
            return 2
        print(f"torchfleet {torchfleet.__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    try:
        mode = listing_mode(command, rest) if command in ("strategies", "accelerators") else None
        if command == "estimate" or mode == "explain":
            from torchfleet.cli_estimate import estimate
            return estimate(command, rest, lambda argv, sink: _run_stage("fit", argv, sink=sink, run=False))
        if mode is not None:
            return _list_registry(command, help_only=mode == "help")
        if command == "consolidate":
            from torchfleet.cli_consolidate import consolidate_command

            return consolidate_command(rest)
        if command == "run":
            from torchfleet.cli_run import run

            return run(rest)
        if command in STAGES:
            return _run_stage(command, rest)
    except TorchfleetError as exc:
        # the library's errors are written for users: one paragraph, no traceback
        print_error(f"torchfleet {command}", exc)
        return 2
    from torchfleet.errors import closest

    commands = [*STAGES, "strategies", "estimate", "accelerators", "consolidate", "run"]
    near = closest(command, commands)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    print(f"torchfleet: error: unknown command {command!r}.{hint} The commands are {', '.join(commands)}; "
          "`torchfleet --help` describes them.", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
