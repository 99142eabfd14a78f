"""Record every call Lightning's Trainer makes on a Precision plugin and an Accelerator passed to it.

Run with the reference Lightning installation (not torchfleet's environment)::

    /work/venv-lightning/bin/python tools/record_lightning_plugin_hooks.py

It writes ``tests/fixtures/lightning_plugin_hooks.json``, the expectations of issue 34 item 4 (a Precision or
Accelerator subclass written against Lightning's signatures is called at the same points, as often). It follows
``record_lightning_strategy_hooks.py`` and shares its recording library (``strategy_hooks_recording.py``):

- A recorder subclass of Lightning's ``Precision`` overrides every public method the classes ``Precision``
  (lightning.pytorch) and its Fabric base define (found with ``inspect``) with one that records the call, its
  arguments bound to the signature where the method is first defined, then runs the parent's. Events start "P.".
- A recorder subclass of Lightning's ``CPUAccelerator`` does the same for ``Accelerator`` (both packages) and
  ``CPUAccelerator``, static methods included. Events start "A.".
- The module and callback hooks are recorded as in the strategy recording ("M.", "C."), so the plugin calls
  can be placed among them. ``Trainer(accelerator=<recorder>, devices="auto", plugins=[<recorder>])``: the
  default strategy (one device). Each stage runs in a fresh process.
"""

from __future__ import annotations

import argparse
import glob
import inspect
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import strategy_hooks_recording as recording  # noqa: E402 - the recording library beside this script
from strategy_hooks_recording import (  # noqa: E402
    CALLBACK_HOOKS,
    MODULE_HOOKS,
    RECORDER,
    SEED,
    build_model_class,
    build_recorder_class,
    derive,
    trainer_options,
    with_recorded_hooks,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "lightning_plugin_hooks.json"
COMMAND = "/work/venv-lightning/bin/python tools/record_lightning_plugin_hooks.py"

STAGES = ("fit", "validate", "test", "predict", "fit_resumed", "fit_clip_norm", "fit_clip_value")
STAGE_SETUP = {
    "fit": "trainer.fit(model): max_epochs=2, limit_train_batches=3, limit_val_batches=2, num_sanity_val_steps=2",
    "validate": "trainer.validate(model) on a fresh model: limit_val_batches=2",
    "test": "trainer.test(model) on a fresh model: limit_test_batches=2",
    "predict": "trainer.predict(model) on a fresh model: limit_predict_batches=2",
    "fit_resumed": "trainer.fit(model, ckpt_path=<the checkpoint fit saved last>) with max_epochs=3",
    "fit_clip_norm": "as fit with gradient_clip_val=0.5 (norm), max_epochs=1",
    "fit_clip_value": "as fit with gradient_clip_val=0.5, gradient_clip_algorithm='value', max_epochs=1",
}
COMMON_SETUP = (
    "Trainer(accelerator=<CPUAccelerator recorder>, devices='auto', plugins=[<Precision recorder>], logger=False, "
    "enable_progress_bar=False, enable_model_summary=False, callbacks=[RecordingCallback(), "
    "ModelCheckpoint(dirpath=<root>/<stage>, save_on_train_epoch_end=True)]); the strategy record's HookModel "
    "(tools/strategy_hooks_recording.py), seed 7, one process per stage."
)
PRECISION_CLASSES = ("lightning.fabric.plugins.precision.precision.Precision",
                     "lightning.pytorch.core.hooks.CheckpointHooks",  # on_save/on_load_checkpoint: a base of Precision
                     "lightning.pytorch.plugins.precision.precision.Precision")
ACCELERATOR_CLASSES = ("lightning.fabric.accelerators.accelerator.Accelerator",
                       "lightning.pytorch.accelerators.accelerator.Accelerator",
                       "lightning.fabric.accelerators.cpu.CPUAccelerator",
                       "lightning.pytorch.accelerators.cpu.CPUAccelerator")


def _classes(names: tuple[str, ...]) -> list[type]:
    import importlib

    out = []
    for name in names:
        module, _, attr = name.rpartition(".")
        out.append(getattr(importlib.import_module(module), attr))
    return out


def public_methods(classes: list[type]) -> dict[str, dict]:
    """name -> {defined_in, kind, signature (the root's: calls are bound to it), trainer_signature (the most derived
    class's)} for every public method of ``classes`` (root first)."""
    methods: dict[str, dict] = {}
    for cls in classes:
        for name, raw in vars(cls).items():
            if name.startswith("_") or isinstance(raw, property):
                continue
            if not (isinstance(raw, (classmethod, staticmethod)) or inspect.isfunction(raw)):
                continue
            function = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
            if isinstance(raw, classmethod):
                kind = "classmethod"
            elif isinstance(raw, staticmethod):
                kind = "staticmethod"
            elif function is not inspect.unwrap(function) and inspect.isgeneratorfunction(inspect.unwrap(function)):
                # a contextlib.contextmanager (main_params is a plain generator: a method)
                kind = "context manager"
            else:
                kind = "method"
            entry = methods.setdefault(name, {"defined_in": [], "kind": kind,
                                              "signature": str(inspect.signature(function))})
            entry["defined_in"].append(f"{cls.__module__.split('.')[1]}.{cls.__name__}")
            # the most derived definition's: what the Trainer's plugin (lightning.pytorch) is called with
            entry["trainer_signature"] = str(inspect.signature(function))
    return methods


def _recorder(base: type, classes: list[type], prefix: str) -> type:
    members = {}
    for name, info in public_methods(classes).items():
        root = next(c for c in classes if name in vars(c))
        raw = vars(root)[name]
        function = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
        members[name] = (info["kind"], inspect.signature(function))
    return build_recorder_class(base, members, [], prefix=prefix)


def run_worker(stage: str, root: str, ckpt_path: str | None) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)

    import lightning.pytorch as pl
    from lightning.pytorch.accelerators import CPUAccelerator
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from lightning.pytorch.plugins.precision import Precision

    recording.ROOT = root
    pl.seed_everything(SEED, verbose=False)
    model_class = with_recorded_hooks(build_model_class(pl.LightningModule), MODULE_HOOKS, "M", ("self",))
    callback_class = with_recorded_hooks(Callback, CALLBACK_HOOKS, "C", ("self", "trainer", "pl_module"))
    RECORDER.add("== plugins constructed")
    precision = _recorder(Precision, _classes(PRECISION_CLASSES), "P")()
    accelerator = _recorder(CPUAccelerator, _classes(ACCELERATOR_CLASSES), "A")()
    options = trainer_options("fit_resumed" if stage == "fit_resumed" else "fit")
    if stage.startswith("fit_clip"):
        options.update(max_epochs=1, gradient_clip_val=0.5,
                       gradient_clip_algorithm="value" if stage.endswith("value") else "norm")
    checkpoint = ModelCheckpoint(dirpath=os.path.join(root, stage), save_on_train_epoch_end=True)
    RECORDER.add("== Trainer(...) called")
    trainer = pl.Trainer(
        accelerator=accelerator, devices="auto", plugins=[precision], logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[callback_class(), checkpoint], default_root_dir=root, **options,
    )
    model = model_class()
    call = "fit" if stage.startswith("fit") else stage
    RECORDER.add(f"== trainer.{call}(model) called")
    getattr(trainer, call)(model, ckpt_path=ckpt_path)
    RECORDER.add(f"== trainer.{call} returned")
    RECORDER.active = False
    Path(root, f"{stage}.json").write_text(json.dumps({"events": RECORDER.events}, indent=0))


def run_all() -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="lightning-plugins-")
    env = dict(os.environ, PYTHONHASHSEED="0", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    runs: dict[str, Any] = {}
    try:
        for stage in STAGES:
            command = [sys.executable, os.path.abspath(__file__), "--worker", stage, work]
            if stage == "fit_resumed":
                command.append(glob.glob(os.path.join(work, "fit", "*.ckpt"))[0])
            print(f"recording {stage}", file=sys.stderr, flush=True)
            done = subprocess.run(command, env=env, timeout=600, cwd=REPO, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{stage} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
            events = json.loads(Path(work, f"{stage}.json").read_text())["events"]
            runs[stage] = {"events": events, "precision_counts": derive(events, "P")["counts"],
                           "accelerator_counts": derive(events, "A")["counts"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        stage, root, *ckpt = args.worker
        run_worker(stage, root, ckpt[0] if ckpt else None)
        return
    import lightning

    runs = run_all()
    document = {
        "about": "Lightning's Trainer calling every public method of a Precision plugin and an Accelerator "
        "(recorder subclasses), per stage: the expectations of issue 34 item 4. See the script's docstring.",
        "command": COMMAND,
        "lightning_version": lightning.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "setup": {"common": COMMON_SETUP, "stages": STAGE_SETUP},
        "contract": {"precision": public_methods(_classes(PRECISION_CLASSES)),
                     "accelerator": public_methods(_classes(ACCELERATOR_CLASSES))},
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
