"""Record the order, counts and arguments of every Strategy hook Lightning's Trainer calls.

Run with the reference Lightning installation (not torchfleet's environment)::

    /work/venv-lightning/bin/python tools/record_lightning_strategy_hooks.py

It writes ``tests/fixtures/lightning_strategy_hooks.json``: the expectations that torchfleet's Trainer is
compared with for issue 26 (a Strategy subclass written against Lightning's signatures must be called at
the same points, as often, with arguments that mean the same). How it works:

- Recorder subclasses of Lightning's ``SingleDeviceStrategy`` and ``DDPStrategy`` are built from the
  classes themselves: every public method found with ``inspect`` on ``Strategy``, ``ParallelStrategy``,
  ``SingleDeviceStrategy`` and ``DDPStrategy`` is overridden by one that records the call (arguments bound
  to the signature where the hook is first defined, so names are the contract's) and then calls the parent
  implementation; every public property (a hand-kept list, checked against ``inspect`` so a Lightning
  upgrade that adds one fails loudly) is overridden by one that counts reads and records writes.
- The LightningModule and a Callback record the hooks that place the Strategy's calls (on_fit_start,
  on_train_batch_start, on_before_backward, ..., on_exception, teardown).
- Each (mode, stage) runs in a fresh process, so one stage's state cannot leak into the next: mode
  "single" (SingleDeviceStrategy on cpu) and "ddp" (DDPStrategy, gloo, accelerator="cpu", devices=2, whose
  launcher re-runs this script for rank 1). Every rank writes its own record; the parent process gathers
  them and derives the counts.

Event strings (one per call, indented two spaces per level of nesting inside another recorded call or
inside a Strategy context manager's block):
``S.<hook>(<arg>: <kind>, <kwarg>=<kind>) -> <return kind>`` for a Strategy method (``-> ...`` only when it
returned something other than None), ``S.<hook> exit`` when a Strategy context manager is left,
``S.<property> = <kind>`` for a property write, ``S.<property> read -> <kind>`` for a read of one of
the properties that change what the Trainer does (FLAG_PROPERTIES; other reads are only counted), ``M.<hook>(...)`` for a LightningModule hook, ``C.<hook>(...)``
for a Callback hook (trainer and pl_module omitted), ``== ...`` for markers around the Trainer's calls, and
`` !! raised <Exception>`` appended to a call that raised.
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
    describe,
    trainer_options,
    with_recorded_hooks,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "lightning_strategy_hooks.json"
COMMAND = "/work/venv-lightning/bin/python tools/record_lightning_strategy_hooks.py"

MODES = ("single", "ddp")
# The stages issue 26 names, then one more: fit with gradient accumulation, the only path on which the
# Trainer enters ParallelStrategy.block_backward_sync.
STAGES = ("fit", "validate", "test", "predict", "fit_resumed", "fit_fails", "fit_accumulate")
STAGE_SETUP = {
    "fit": "trainer.fit(model): max_epochs=2, limit_train_batches=3, limit_val_batches=2, num_sanity_val_steps=2",
    "validate": "trainer.validate(model) on a fresh model: limit_val_batches=2",
    "test": "trainer.test(model) on a fresh model: limit_test_batches=2",
    "predict": "trainer.predict(model) on a fresh model: limit_predict_batches=2",
    "fit_resumed": "trainer.fit(model, ckpt_path=<the checkpoint fit saved last, epoch=1-step=6.ckpt>) with "
    "max_epochs=3 (one more epoch), otherwise as fit",
    "fit_fails": "as fit, but training_step raises RuntimeError at batch_idx 1 of epoch 0 (on every rank)",
    "fit_accumulate": "as fit with accumulate_grad_batches=2, max_epochs=1, limit_train_batches=4",
}
COMMON_SETUP = (
    "Trainer(accelerator='cpu', devices=1|2, strategy=<recorder>, logger=False, enable_progress_bar=False, "
    "enable_model_summary=False, callbacks=[RecordingCallback(), ModelCheckpoint(dirpath=<root>/<stage>, "
    "save_on_train_epoch_end=True)]) (monitor=None, save_top_k=1: each epoch's save removes the previous "
    "file). Model: HookModel, a Linear(32, 2) built in configure_model, MSE loss against ones, "
    "self.log('train_loss'), self.log('val_loss'/'test_loss', sync_dist=True), predict_step returns the "
    "output; SGD(lr=0.1) with StepLR(step_size=1); every dataloader: 64 random samples of 32 features, "
    "batch_size=2, no workers. Every stage runs in a fresh process (ddp: two, rank 1 started by "
    "Lightning's launcher), seed 7."
)

# Properties of Lightning's Strategy classes, kept by hand and checked against inspect at run time.
HAND_PROPERTIES = {
    "Strategy": [
        "launcher", "accelerator", "checkpoint_io", "precision_plugin", "optimizers", "root_device",
        "is_global_zero", "model", "lightning_module", "restore_checkpoint_after_setup",
        "lightning_restore_optimizer", "handles_gradient_accumulation",
    ],
    "ParallelStrategy": [
        "root_device", "global_rank", "local_rank", "node_rank", "world_size", "is_global_zero",
        "parallel_devices", "distributed_sampler_kwargs",
    ],
    "SingleDeviceStrategy": ["root_device", "is_global_zero"],
    "DDPStrategy": [
        "is_distributed", "root_device", "num_nodes", "num_processes", "distributed_sampler_kwargs",
        "process_group_backend",
    ],
}
# Public instance attributes (not properties) that the Trainer reads or writes on a strategy.
PLAIN_ATTRIBUTES = {
    "Strategy": ["lr_scheduler_configs"],
    "ParallelStrategy": ["cluster_environment"],
    "SingleDeviceStrategy": ["strategy_name (class attribute)", "global_rank", "local_rank", "world_size"],
}

def _contract_classes():
    from lightning.pytorch.strategies import DDPStrategy, ParallelStrategy, SingleDeviceStrategy, Strategy

    return (Strategy, ParallelStrategy, SingleDeviceStrategy, DDPStrategy)


def public_members(base: type) -> tuple[dict[str, dict], dict[str, dict]]:
    """Every public method and property of the contract classes in ``base``'s MRO, found with inspect.

    Returns (methods, properties): name -> {"defined_in": [classes, root first], "kind", "signature"}.
    """
    contract = [cls for cls in reversed(base.__mro__) if cls in _contract_classes()]
    methods: dict[str, dict] = {}
    properties: dict[str, dict] = {}
    for cls in contract:
        found_properties = set()
        for name, raw in vars(cls).items():
            if name.startswith("_"):
                continue
            if isinstance(raw, property):
                found_properties.add(name)
                entry = properties.setdefault(name, {"defined_in": [], "setter": False})
                entry["defined_in"].append(cls.__name__)
                entry["setter"] = entry["setter"] or raw.fset is not None
            elif isinstance(raw, (classmethod, staticmethod)) or inspect.isfunction(raw):
                function = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
                if isinstance(raw, classmethod):
                    kind = "classmethod"
                elif inspect.isgeneratorfunction(inspect.unwrap(function)):
                    kind = "context manager"
                else:
                    kind = "method"
                entry = methods.setdefault(
                    name, {"defined_in": [], "kind": kind, "signature": str(inspect.signature(function))}
                )
                entry["defined_in"].append(cls.__name__)
        hand = set(HAND_PROPERTIES.get(cls.__name__, []))
        if hand != found_properties:
            raise SystemExit(
                f"{cls.__name__}: the hand-kept property list differs from inspect's: "
                f"missing {sorted(found_properties - hand)}, stale {sorted(hand - found_properties)}"
            )
    return methods, properties


def make_recorder_class(base: type) -> type:
    """A subclass of Lightning's ``base`` that overrides every public method and property with a recording one."""
    methods, properties = public_members(base)
    members = {}
    for name, info in methods.items():
        root_cls = next(c for c in _contract_classes() if c.__name__ == info["defined_in"][0])
        raw_root = vars(root_cls)[name]
        root_function = raw_root.__func__ if isinstance(raw_root, classmethod) else raw_root
        members[name] = (info["kind"], inspect.signature(root_function))  # the contract's names for the arguments
    return build_recorder_class(base, members, list(properties))


def run_worker(mode: str, stage: str, root: str, ckpt_path: str | None) -> None:
    """One stage in this process (and, under ddp, rank 1 in the process Lightning's launcher starts)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)

    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    recording.ROOT = root
    pl.seed_everything(SEED, verbose=False)
    model_class = with_recorded_hooks(build_model_class(pl.LightningModule), MODULE_HOOKS, "M", ("self",))
    callback_class = with_recorded_hooks(Callback, CALLBACK_HOOKS, "C", ("self", "trainer", "pl_module"))

    RECORDER.add("== strategy constructed")
    if mode == "single":
        strategy = make_recorder_class(SingleDeviceStrategy)(device="cpu")
        devices = 1
    else:
        strategy = make_recorder_class(DDPStrategy)(process_group_backend="gloo")
        devices = 2
    fit_like = stage.startswith("fit")
    options = trainer_options(stage)
    checkpoint = ModelCheckpoint(dirpath=os.path.join(root, stage), save_on_train_epoch_end=True)
    RECORDER.add("== Trainer(...) called")
    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, strategy=strategy, logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[callback_class(), checkpoint], default_root_dir=root, **options,
    )
    model = model_class(fail_at=(0, 1) if stage == "fit_fails" else None)
    call = "fit" if fit_like else stage
    RECORDER.add(f"== trainer.{call}(model{', ckpt_path=...' if ckpt_path else ''}) called")
    try:
        getattr(trainer, call)(model, ckpt_path=ckpt_path)
        RECORDER.add(f"== trainer.{call} returned")
    except RuntimeError as error:
        RECORDER.add(f"== trainer.{call} raised {describe(error)}")
    RECORDER.active = False

    rank = trainer.global_rank
    records = Path(root, "records")
    records.mkdir(parents=True, exist_ok=True)
    record = {"events": RECORDER.events, "property_reads": dict(sorted(RECORDER.property_reads.items()))}
    Path(records, f"{stage}-rank{rank}.json").write_text(json.dumps(record, indent=0))
    if torch.distributed.is_initialized():
        # rank 0's parent reads both records once this process exits: wait until every rank has written
        torch.distributed.barrier()


# ----------------------------------------------------------------------------------------------------
# The parent process: run every (mode, stage), gather, derive counts, write the JSON.


def run_all() -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="lightning-hooks-")
    env = dict(os.environ, PYTHONHASHSEED="0", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    env.pop("MASTER_PORT", None)
    runs: dict[str, Any] = {}
    try:
        for mode in MODES:
            root = os.path.join(work, mode)
            os.makedirs(root)
            runs[mode] = {}
            for stage in STAGES:
                command = [sys.executable, os.path.abspath(__file__), "--worker", mode, stage, root]
                if stage == "fit_resumed":
                    (saved,) = glob.glob(os.path.join(root, "fit", "*.ckpt"))
                    command.append(saved)
                print(f"recording {mode} {stage}", file=sys.stderr, flush=True)
                done = subprocess.run(command, env=env, timeout=600, cwd=REPO, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{mode} {stage} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
                runs[mode][stage] = {}
                for rank in range(2 if mode == "ddp" else 1):
                    record = json.loads(Path(root, "records", f"{stage}-rank{rank}.json").read_text())
                    runs[mode][stage][str(rank)] = {**derive(record["events"]), **record}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return runs


def contract() -> dict[str, Any]:
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    methods, properties = public_members(DDPStrategy)
    single_methods, single_properties = public_members(SingleDeviceStrategy)
    for name, info in single_methods.items():
        for cls in info["defined_in"]:
            if cls not in methods.setdefault(name, dict(info, defined_in=[]))["defined_in"]:
                methods[name]["defined_in"].append(cls)
    for name, info in single_properties.items():
        for cls in info["defined_in"]:
            if cls not in properties.setdefault(name, dict(info, defined_in=[]))["defined_in"]:
                properties[name]["defined_in"].append(cls)
    return {
        "methods": dict(sorted(methods.items())),
        "properties": dict(sorted(properties.items())),
        "hand_kept_property_list": HAND_PROPERTIES,
        "plain_attributes_not_overridden": PLAIN_ATTRIBUTES,
    }


def summary(runs: dict[str, Any], methods: dict[str, Any], properties: dict[str, Any]) -> dict[str, Any]:
    """Per hook and property: its count in every (mode, stage, rank); and those no run used."""

    def table(names, key: str) -> dict[str, dict[str, int]]:
        rows = {}
        for name in names:
            rows[name] = {
                f"{mode}/{stage}/{rank}": record[key].get(name, 0)
                for mode, stages in runs.items()
                for stage, ranks in stages.items()
                for rank, record in ranks.items()
            }
        return rows

    hooks = table(methods, "counts")
    reads = table(properties, "property_reads")
    return {
        "counts_per_hook": hooks,
        "never_called": sorted(name for name, row in hooks.items() if not any(row.values())),
        "property_reads_per_property": reads,
        "never_read": sorted(name for name, row in reads.items() if not any(row.values())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        mode, stage, root, *ckpt = args.worker
        run_worker(mode, stage, root, ckpt[0] if ckpt else None)
        return

    import lightning

    runs = run_all()
    members = contract()
    document = {
        "about": "Lightning's Trainer calling every public method and property of Lightning's Strategy, "
        "ParallelStrategy, SingleDeviceStrategy and DDPStrategy (recorder subclasses), per mode, stage and "
        "rank: the expectations of issue 26. Produced by the command below; see the script's docstring "
        "for the event format.",
        "command": COMMAND,
        "lightning_version": lightning.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "setup": {"common": COMMON_SETUP, "stages": STAGE_SETUP, "modes": {
            "single": "SingleDeviceStrategy(device='cpu') recorder, devices=1",
            "ddp": "DDPStrategy(process_group_backend='gloo') recorder, devices=2 (start_method popen: "
            "Lightning re-runs the script for rank 1)",
        }},
        "event_format": __doc__.split("Event strings")[1].strip(),
        "contract": members,
        "summary": summary(runs, members["methods"], members["properties"]),
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
