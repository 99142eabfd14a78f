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
from typing import Any

from torchfleet.errors import ConfigurationError

EXAMPLE_MODEL = "torchfleet.examples.addition.AdditionTransformer"
EXAMPLE_DATA = "torchfleet.examples.addition.AdditionData"
STAGES = ("fit", "validate", "test", "predict")

_HELP = """usage: torchfleet <command> [options]

commands:
  fit           train a model (without --model: the bundled addition example)
  validate      run the validation loop once
  test          run the test loop once
  predict       run predict_step over the predict data
  strategies    list the registered strategies (name, class, description)
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


def _table(rows: list[tuple[str, str, str]], header: tuple[str, str, str]) -> str:
    # the last column is left ragged: descriptions vary a lot in length
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(2)]
    lines = [f"{header[0]:<{widths[0]}}  {header[1]:<{widths[1]}}  {header[2]}"]
    lines += [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in rows]
    return "\n".join(lines)


def _list_registry(kind: str) -> int:
    if kind == "strategies":
        from torchfleet.strategies.registry import StrategyRegistry as registry
    else:
        from torchfleet.accelerators.registry import AcceleratorRegistry as registry
    registry.load_entry_points()
    rows = [(e.name, e.cls.__name__, e.description) for e in registry.entries()]
    print(_table(rows, ("name", "class", "description")))
    return 0


_CLASS_PATH_FORMS = (
    "Give it as a dotted import path, 'package.module.ClassName' (importable from the current "
    "directory or an installed package), or as a file and a class, 'path/to/file.py:ClassName'."
)


def _looks_like_class_path(value: str) -> bool:
    # --model also accepts a YAML/JSON config or a bare class name; only class paths are checked here
    value = value.strip()
    if not value or value[0] in "{[" or "\n" in value or value.endswith((".yaml", ".yml", ".json")):
        return False
    return ".py:" in value or "." in value


def _import_file_class(kind: str, given: str) -> str:
    """Import ``path/to/file.py`` as a module named after the file; return its dotted class path."""
    import importlib

    file_name, _, class_name = given.rpartition(":")
    path = os.path.abspath(file_name)
    module_name = os.path.splitext(os.path.basename(path))[0]
    if not os.path.isfile(path):
        raise ConfigurationError(
            f"--{kind} {given!r} could not be imported: there is no file {path!r}. {_CLASS_PATH_FORMS}"
        )
    if not module_name.isidentifier():
        raise ConfigurationError(
            f"--{kind} {given!r} could not be imported: {os.path.basename(path)!r} is not a valid Python "
            f"module name (letters, digits and underscores only). Rename the file. {_CLASS_PATH_FORMS}"
        )
    # Prefer the dotted name relative to the current directory (sub/my_model.py -> sub.my_model):
    # --print_config then writes a class path that works again from the same directory.
    relative = os.path.splitext(os.path.relpath(path))[0].split(os.sep)
    if all(part.isidentifier() for part in relative):
        import importlib.util

        try:
            spec = importlib.util.find_spec(".".join(relative))
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin and os.path.abspath(spec.origin) == path:
            module_name = ".".join(relative)
    loaded = sys.modules.get(module_name)
    if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") != path:
        raise ConfigurationError(
            f"--{kind} {given!r} could not be imported: a different module named {module_name!r} is "
            f"already imported (from {getattr(loaded, '__file__', None)!r}). Rename the file. {_CLASS_PATH_FORMS}"
        )
    # The file's folder goes on sys.path (not a one-off module spec) so that processes started by
    # the spawn launcher, which import classes by module name, find the module too.
    folder = os.path.dirname(path)
    if "." not in module_name and folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigurationError(
            f"--{kind} {given!r} could not be imported: importing {path!r} failed with "
            f"{type(exc).__name__}: {exc}. {_CLASS_PATH_FORMS}"
        ) from exc
    return f"{module_name}.{class_name}"


def _check_class_path(kind: str, given: str) -> str:
    """Import the class ``given`` for --model/--data; return it as a dotted path, or raise one paragraph."""
    import importlib

    from torchfleet.data import DataModule
    from torchfleet.module import Module

    dotted = _import_file_class(kind, given) if ".py:" in given else given.strip()
    module_name, _, class_name = dotted.rpartition(".")
    if not module_name or not class_name:
        raise ConfigurationError(f"--{kind} {given!r} is not a class path. {_CLASS_PATH_FORMS}")
    try:
        obj = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"--{kind} {given!r} could not be imported ({type(exc).__name__}: {exc}). {_CLASS_PATH_FORMS}"
        ) from None
    base = Module if kind == "model" else DataModule
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise ConfigurationError(
            f"--{kind} {given!r} is {obj!r}, not a subclass of torchfleet.{base.__name__}. "
            f"--{kind} takes a {base.__name__} class; its constructor's arguments become --{kind}.NAME options."
        )
    return dotted


def _check_config_file(path: str) -> tuple[str, bool]:
    """Check a --config file's model/data class paths; returns what to pass on and whether it names a model.

    A file-form class path ('file.py:Class') is rewritten to its dotted form, and the config is then
    passed on as YAML text instead of the file's path.
    """
    if not os.path.isfile(path):
        return path, False  # jsonargparse reports a missing file, or parses YAML text given inline
    import yaml

    with open(path) as f:
        config = yaml.safe_load(f) or {}
    if not isinstance(config, dict):
        return path, False
    rewritten = False
    for kind in ("model", "data"):
        section = config.get(kind)
        value = section.get("class_path") if isinstance(section, dict) else section
        if isinstance(value, str) and _looks_like_class_path(value):
            dotted = _check_class_path(kind, value)
            if dotted != value:
                rewritten = True
                if isinstance(section, dict):
                    section["class_path"] = dotted
                else:
                    config[kind] = dotted
    model = config.get("model")
    # a model section without a class (only init_args) tunes the bundled example
    names_model = isinstance(model, str) or (isinstance(model, dict) and "class_path" in model)
    return (yaml.safe_dump(config) if rewritten else path), names_model


def _prepare_argv(argv: list[str]) -> tuple[list[str], bool]:
    """Check --model/--data class paths before jsonargparse sees them; True when the example is to be trained.

    jsonargparse's own message for a class it cannot import is a page of union-type diagnostics;
    checking first gives one paragraph with the import error in it.
    """
    out: list[str] = []
    names_model = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        option, eq, value = arg.partition("=")
        if option in ("--model", "--data", "--config") and not eq and i + 1 < len(argv):
            value, i = argv[i + 1], i + 1
        elif option not in ("--model", "--data", "--config"):
            out.append(arg)
            i += 1
            continue
        if option == "--config":
            value, has_model = _check_config_file(value)
            names_model = names_model or has_model
        else:
            names_model = names_model or option == "--model"
            if _looks_like_class_path(value):
                value = _check_class_path(option[2:], value)
        out.append(f"{option}={value}")
        i += 1
    return out, not names_model


def _parser(stage: str, example: bool) -> Any:
    from jsonargparse import ActionConfigFile, ArgumentParser

    from torchfleet.data import DataModule
    from torchfleet.module import Module
    from torchfleet.trainer.trainer import Trainer

    parser = ArgumentParser(
        prog=f"torchfleet {stage}",
        description=f"torchfleet {stage}: Trainer.{stage} from the command line.",
    )
    parser.add_argument("--config", action=ActionConfigFile,
                        help="a YAML file with trainer:, model:, data:, seed_everything:, ckpt_path: sections")
    parser.add_argument("--seed_everything", "--seed", type=int | None, default=0 if example else None,
                        help="seed every random generator with this value (null: do not seed)")
    parser.add_argument("--ckpt_path", type=str | None, default=None, help="checkpoint to resume from, or 'last'")
    parser.add_class_arguments(Trainer, "trainer")
    parser.add_subclass_arguments(Module, "model", required=True,
                                  help="the Module class ('pkg.module.Class' or 'file.py:Class') and its arguments")
    parser.add_subclass_arguments(DataModule, "data", required=False, help="the DataModule class and its arguments")
    if example:
        from torchfleet.examples import addition

        parser.set_defaults({"model": {"class_path": EXAMPLE_MODEL}, "data": {"class_path": EXAMPLE_DATA}})
        defaults = getattr(addition, "default_trainer_kwargs", None)
        if defaults is not None:
            parser.set_defaults({f"trainer.{k}": v for k, v in defaults().items()})
    return parser


def _last_per_epoch(rows: list[dict[str, str]], key: str) -> list[tuple[int, float]]:
    by_epoch: dict[int, float] = {}
    for r in rows:
        if r.get(key) and r.get("epoch"):
            by_epoch[int(float(r["epoch"]))] = float(r[key])
    return sorted(by_epoch.items())


def _plot(log_dir: str) -> str | None:
    """Write loss_curve.png beside metrics.csv: training loss by step, validation metrics by epoch."""
    metrics_file = os.path.join(log_dir, "metrics.csv")
    if not os.path.isfile(metrics_file):
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("No loss curve written: `pip install matplotlib` (or torchfleet[plot]) enables it.")
        return None
    import csv

    with open(metrics_file, newline="") as f:
        reader = csv.DictReader(f)
        columns = list(reader.fieldnames or [])
        rows = list(reader)
    train_keys = [k for k in columns if "loss" in k and not k.startswith(("val", "test", "predict"))]
    val_keys = [k for k in columns if k.startswith("val")]
    if not train_keys and not val_keys:
        return None
    panels = int(bool(train_keys)) + int(bool(val_keys))
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.5), squeeze=False)
    ax_iter = iter(axes[0])
    if train_keys:
        ax = next(ax_iter)
        for key in train_keys:
            points = [(int(float(r["step"])), float(r[key])) for r in rows if r.get(key)]
            if points:
                ax.plot(*zip(*points), label=key)
        ax.set(xlabel="step", ylabel="loss", title="training")
        ax.legend()
    if val_keys:
        ax = next(ax_iter)
        losses = [k for k in val_keys if "loss" in k]
        others = [k for k in val_keys if k not in losses]
        # accuracy-like metrics live on [0, 1]; a second y axis keeps a large loss from flattening them
        ax_right = ax.twinx() if losses and others else ax
        for n, key in enumerate(losses + others):
            target = ax if key in losses else ax_right
            points = _last_per_epoch(rows, key)
            if points:
                # explicit colours: a twin axis would restart the colour cycle
                target.plot(*zip(*points), "o-" if key in losses else "s--", label=key, color=f"C{n}")
        if losses:
            ax.set_ylabel(", ".join(losses))
        if others:
            ax_right.set_ylabel(", ".join(others))
        ax.set(xlabel="epoch", title="validation")
        handles = [h for a in dict.fromkeys([ax, ax_right]) for h in a.get_legend_handles_labels()[0]]
        if handles:
            ax.legend(handles=handles)
    fig.tight_layout()
    path = os.path.join(log_dir, "loss_curve.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _run_stage(stage: str, argv: list[str]) -> int:
    # `torchfleet` is a console script, so the user's directory is not on sys.path as it is for
    # `python -m torchfleet`: put it there, so that --model mymodels.Net finds ./mymodels.py.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    argv, example = _prepare_argv(argv)
    parser = _parser(stage, example)
    try:
        cfg = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --print_config, or jsonargparse's own usage error
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if cfg.seed_everything is not None:
        from torchfleet.seed import seed_everything

        seed_everything(cfg.seed_everything)
    # `instantiate` replaced `instantiate_classes` in jsonargparse 4.49; older releases have only the latter
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    objects = instantiate(cfg)
    trainer, model, data = objects.trainer, objects.model, objects.get("data")
    getattr(trainer, stage)(model, datamodule=data, ckpt_path=cfg.ckpt_path)
    if stage == "fit" and trainer.is_global_zero:
        _report(trainer)
    return 0


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
        parts.append(f"Logs: {trainer.log_dir}" + (" (metrics.csv, loss_curve.png)" if plot else ""))
    ck = trainer.checkpoint_callback
    if ck is not None and (ck.best_model_path or ck.last_model_path):
        parts.append(f"best checkpoint: {ck.best_model_path or ck.last_model_path}")
    if parts:
        print("; ".join(parts))


def _consolidate(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="torchfleet consolidate",
        description="Write the checkpoint CKPT (a single file, or a sharded fsdp/deepspeed directory written by any "
                    "number of processes) as one ordinary checkpoint file OUT. torch.load(OUT)['state_dict'] loads "
                    "into the plain model; with --with-optimizer, fit(ckpt_path=OUT) resumes under any strategy.",
    )
    parser.add_argument("ckpt", metavar="CKPT", help="the checkpoint to read (file or directory)")
    parser.add_argument("out", metavar="OUT", help="the file to write")
    parser.add_argument("--with-optimizer", action="store_true",
                        help="keep the optimizer states (needed to resume training; the file is ~3x larger with Adam)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    from torchfleet.checkpoint.consolidate import consolidate

    if not os.path.exists(args.ckpt):
        from torchfleet.errors import CheckpointError

        raise CheckpointError(f"{args.ckpt!r} does not exist; give the path of a checkpoint file or directory.")
    summary = consolidate(args.ckpt, args.out, with_optimizer=args.with_optimizer)
    print(f"Wrote {args.out}: {summary['tensors']} tensors, {summary['parameters']:,} parameters"
          f"{', with optimizer state' if summary['optimizer'] else ''} ({summary['bytes'] / 1e6:.1f} MB); "
          f"entries: {', '.join(summary['entries'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the ``torchfleet`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    from torchfleet.errors import TorchfleetError

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_HELP, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        import torchfleet

        print(f"torchfleet {torchfleet.__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    try:
        if command in ("strategies", "accelerators"):
            return _list_registry(command)
        if command == "consolidate":
            return _consolidate(rest)
        if command == "run":
            from torchfleet.cli_run import run

            return run(rest)
        if command in STAGES:
            return _run_stage(command, rest)
    except TorchfleetError as exc:
        # the library's errors are written for users: one paragraph, no traceback
        print(f"torchfleet {command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    from torchfleet.errors import closest

    near = closest(command, [*STAGES, "strategies", "accelerators", "consolidate", "run"])
    hint = f" Did you mean {near[0]!r}?" if near else ""
    print(f"torchfleet: unknown command {command!r}.{hint}\n\n{_HELP}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
