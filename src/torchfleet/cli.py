"""The ``torchfleet`` command: fit/validate/test/predict a Module from the command line, list strategies.

    torchfleet fit                                    # the bundled addition example
    torchfleet fit --model pkg.mod.MyModel --data pkg.mod.MyData --trainer.max_epochs=10 --model.lr=1e-3
    torchfleet fit --config run.yaml --trainer.devices=2
    torchfleet fit --print_config > run.yaml          # the resolved configuration, to edit and reuse
    torchfleet strategies                             # the registered strategies
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

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

`torchfleet <command> --help` lists a command's options: every Trainer argument as
--trainer.NAME, the model's as --model.NAME, the data module's as --data.NAME.
"""

log = logging.getLogger("torchfleet")


def _table(rows: list[tuple[str, str, str]], header: tuple[str, str, str]) -> str:
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


def _uses_example(argv: list[str]) -> bool:
    """No --model on the command line and none in a --config file: train the bundled example."""
    if any(a == "--model" or a.startswith("--model=") for a in argv):
        return False
    for i, a in enumerate(argv):
        path = argv[i + 1] if a == "--config" and i + 1 < len(argv) else (a.split("=", 1)[1] if a.startswith("--config=") else None)
        if path and os.path.isfile(path):
            import yaml

            with open(path) as f:
                config = yaml.safe_load(f) or {}
            if isinstance(config, dict) and config.get("model"):
                return False
    return True


def _parser(stage: str, example: bool) -> Any:
    from jsonargparse import ActionConfigFile, ArgumentParser

    from torchfleet.data import DataModule
    from torchfleet.module import Module
    from torchfleet.trainer.trainer import Trainer

    parser = ArgumentParser(prog=f"torchfleet {stage}", description=f"torchfleet {stage}: Trainer.{stage} from the command line.")
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file with trainer:, model:, data: sections")
    parser.add_argument("--seed_everything", type=int | None, default=0 if example else None,
                        help="seed every random generator with this value (null: do not seed)")
    parser.add_argument("--ckpt_path", type=str | None, default=None, help="checkpoint to resume from, or 'last'")
    parser.add_class_arguments(Trainer, "trainer")
    parser.add_subclass_arguments(Module, "model", required=True, help="the Module class (dotted path) and its arguments")
    parser.add_subclass_arguments(DataModule, "data", required=False, help="the DataModule class and its arguments")
    if example:
        from torchfleet.examples.addition import default_trainer_kwargs

        parser.set_defaults({"model": {"class_path": EXAMPLE_MODEL}, "data": {"class_path": EXAMPLE_DATA}})
        parser.set_defaults({f"trainer.{k}": v for k, v in default_trainer_kwargs().items()})
    return parser


def _plot(log_dir: str) -> str | None:
    """loss_curve.png beside metrics.csv: train loss by step, validation metrics by epoch."""
    metrics_file = os.path.join(log_dir, "metrics.csv")
    if not os.path.isfile(metrics_file):
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("No loss curve: `pip install matplotlib` (or torchfleet[plot]) enables it.")
        return None
    import csv

    with open(metrics_file) as f:
        rows = list(csv.DictReader(f))
    train = [(int(r["step"]), float(r["train_loss"])) for r in rows if r.get("train_loss")]
    val_keys = [k for k in (rows[0].keys() if rows else []) if k.startswith("val_")]
    fig, axes = plt.subplots(1, 1 + bool(val_keys), figsize=(10 if val_keys else 5, 3.5))
    axes = list(axes) if val_keys else [axes]
    if train:
        axes[0].plot(*zip(*train))
        axes[0].set(xlabel="step", ylabel="train_loss", title="training loss", yscale="log")
    for key in val_keys:
        points = [(int(r["step"]), float(r[key])) for r in rows if r.get(key)]
        if points:
            axes[1].plot(*zip(*points), marker="o", label=key)
    if val_keys:
        axes[1].set(xlabel="step", title="validation")
        axes[1].legend()
    fig.tight_layout()
    path = os.path.join(log_dir, "loss_curve.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _run_stage(stage: str, argv: list[str]) -> int:
    example = _uses_example(argv)
    parser = _parser(stage, example)
    cfg = parser.parse_args(argv)
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    if cfg.seed_everything is not None:
        from torchfleet.trainer.trainer import seed_everything

        seed_everything(cfg.seed_everything)
    objects = instantiate(cfg)
    trainer, model, data = objects.trainer, objects.model, objects.get("data")
    if stage == "fit":
        trainer.fit(model, datamodule=data, ckpt_path=cfg.ckpt_path)
        if trainer.is_global_zero:
            _report(trainer)
    elif stage == "predict":
        trainer.predict(model, datamodule=data, ckpt_path=cfg.ckpt_path)
    else:
        getattr(trainer, stage)(model, datamodule=data, ckpt_path=cfg.ckpt_path)
    return 0


def _report(trainer: Any) -> None:
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()))
    print(f"Finished: epoch {trainer.current_epoch}, step {trainer.global_step}; {shown}")
    if trainer.loggers:
        print(f"Logs: {trainer.log_dir}")
        plot = _plot(trainer.log_dir)
        if plot:
            print(f"Loss curve: {plot}")
    ck = trainer.checkpoint_callback
    if ck is not None and (ck.best_model_path or ck.last_model_path):
        print(f"Checkpoint: {ck.best_model_path or ck.last_model_path}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``torchfleet`` command; returns the exit code."""
    from torchfleet.errors import TorchfleetError

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_HELP, end="")
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        import torchfleet

        print(f"torchfleet {torchfleet.__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    try:
        if command in ("strategies", "accelerators"):
            return _list_registry(command)
        if command in STAGES:
            return _run_stage(command, rest)
    except TorchfleetError as exc:
        print(f"torchfleet {command}: error: {exc}", file=sys.stderr)
        return 2
    from torchfleet.errors import closest

    near = closest(command, [*STAGES, "strategies", "accelerators"])
    hint = f" Did you mean {near[0]!r}?" if near else ""
    print(f"torchfleet: unknown command {command!r}.{hint}\n\n{_HELP}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
