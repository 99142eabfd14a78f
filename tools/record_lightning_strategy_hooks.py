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
import contextlib
import functools
import glob
import inspect
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import torch

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
# Properties through which a strategy changes what the Trainer does: their reads are events too (the
# others' reads are only counted: lightning_module alone is read hundreds of times in one fit).
FLAG_PROPERTIES = (
    "restore_checkpoint_after_setup", "lightning_restore_optimizer", "handles_gradient_accumulation",
    "distributed_sampler_kwargs",
)
# Public instance attributes (not properties) that the Trainer reads or writes on a strategy.
PLAIN_ATTRIBUTES = {
    "Strategy": ["lr_scheduler_configs"],
    "ParallelStrategy": ["cluster_environment"],
    "SingleDeviceStrategy": ["strategy_name (class attribute)", "global_rank", "local_rank", "world_size"],
}

MODULE_HOOKS = (
    "setup", "configure_model", "configure_optimizers", "on_fit_start", "on_train_start",
    "on_train_epoch_start", "on_train_batch_start", "training_step", "on_before_backward",
    "on_after_backward", "on_before_optimizer_step", "on_train_batch_end", "on_train_epoch_end",
    "on_validation_start", "validation_step", "on_validation_end", "on_test_start", "test_step",
    "on_test_end", "on_predict_start", "predict_step", "on_predict_end", "on_save_checkpoint",
    "on_load_checkpoint", "on_train_end", "on_fit_end", "teardown",
)
CALLBACK_HOOKS = (
    "setup", "on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start",
    "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_train_batch_end",
    "on_train_epoch_end", "on_validation_start", "on_validation_end", "on_test_start", "on_test_end",
    "on_predict_start", "on_predict_end", "on_save_checkpoint", "on_load_checkpoint", "on_train_end",
    "on_fit_end", "on_exception", "teardown",
)
SEED = 7


# ----------------------------------------------------------------------------------------------------
# Describing arguments: kinds, not values (values only where they are small and deterministic).

ROOT = ""  # the run's folder, written as <root> in descriptions


def describe(value: Any, depth: int = 0) -> str:
    """A short, deterministic description of a value's kind."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return f"int {value}"
    if isinstance(value, float):
        return "float"
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if ROOT:
            text = text.replace(ROOT, "<root>")
        return f"{type(value).__name__} {text!r}"
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return f"Tensor({dtype}, {list(value.shape)}, {value.device.type})"
    if isinstance(value, torch.device):
        return f"device({value})"
    if isinstance(value, BaseException):
        return f"{type(value).__name__}({str(value).splitlines()[0] if str(value) else ''!r})"
    if isinstance(value, torch.utils.data.DataLoader):
        sampler = type(value.sampler).__name__ if value.batch_sampler is None else type(value.batch_sampler.sampler).__name__
        return f"DataLoader(batch_size={value.batch_size}, sampler={sampler})"
    if isinstance(value, dict):
        if depth > 0:
            return f"dict({len(value)})"
        keys = sorted(str(k) for k in value)
        return f"dict with keys [{', '.join(keys)}]"
    if isinstance(value, (list, tuple)):
        if depth > 0 or len(value) > 4:
            return f"{type(value).__name__}({len(value)})"
        return f"{type(value).__name__}[{', '.join(describe(v, depth + 1) for v in value)}]"
    if type(value).__name__ == "ReduceOp" or "RedOpType" in type(value).__name__:
        return f"ReduceOp.{getattr(value, 'name', value)}"
    if isinstance(value, torch.nn.Module):
        return type(value).__name__
    if isinstance(value, torch.optim.Optimizer):
        return type(value).__name__
    if isinstance(value, contextlib.AbstractContextManager):
        return f"context manager ({type(value).__name__})"
    if inspect.isfunction(value) or inspect.ismethod(value):
        return "callable"
    if callable(value) and not isinstance(value, type):
        return f"callable ({type(value).__name__})"
    return type(value).__name__


def describe_call(signature: inspect.Signature, args: tuple, kwargs: dict, skip: tuple[str, ...]) -> str:
    """The arguments as passed, named by the signature: ``name: kind`` positionally, ``name=kind`` by keyword."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:  # a call Lightning's own signature cannot bind: record it as such
        return f"<does not bind: {error}>"
    parts = []
    for name, value in bound.arguments.items():
        if name in skip:
            continue
        param = signature.parameters[name]
        if param.kind is param.VAR_POSITIONAL:
            parts.extend(f"*{describe(v)}" for v in value)
        elif param.kind is param.VAR_KEYWORD:
            parts.extend(f"{k}={describe(v)}" for k, v in value.items())
        elif name in kwargs:
            parts.append(f"{name}={describe(value)}")
        else:
            parts.append(f"{name}: {describe(value)}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------------------------------
# The recorder: one per process.


class Recorder:
    """Ordered events (with nesting) and property read counts of one process."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.depth = 0
        self.active = True
        self.property_reads: Counter[str] = Counter()

    def add(self, text: str) -> int:
        self.events.append("  " * self.depth + text)
        return len(self.events) - 1

    def append_to(self, index: int, suffix: str) -> None:
        self.events[index] += suffix


RECORDER = Recorder()


def recorded_call(prefix: str, name: str, signature: inspect.Signature, call, skip=("self",)):
    """A function recording ``prefix.name(args)`` and then calling ``call``; nested calls are indented."""

    def wrapper(*args, **kwargs):
        if not RECORDER.active:
            return call(*args, **kwargs)
        index = RECORDER.add(f"{prefix}.{name}({describe_call(signature, args, kwargs, skip)})")
        RECORDER.depth += 1
        try:
            result = call(*args, **kwargs)
        except BaseException as error:
            RECORDER.append_to(index, f" !! raised {type(error).__name__}")
            raise
        finally:
            RECORDER.depth -= 1
        if result is not None:
            RECORDER.append_to(index, f" -> {describe(result)}")
        return result

    return wrapper


class _RecordedContext:
    """Wraps a context manager a Strategy hook returned: calls inside it are nested, leaving it is recorded."""

    def __init__(self, context, name: str) -> None:
        self.context, self.name = context, name

    def __enter__(self):
        value = self.context.__enter__()
        RECORDER.depth += 1
        return value

    def __exit__(self, *exc):
        RECORDER.depth -= 1
        RECORDER.add(f"S.{self.name} exit")
        return self.context.__exit__(*exc)


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
    """A subclass of ``base`` overriding every public method and property with a recording one."""
    methods, properties = public_members(base)
    namespace: dict[str, Any] = {"__module__": __name__}
    for name, info in methods.items():
        root_cls = next(c for c in _contract_classes() if c.__name__ == info["defined_in"][0])
        raw_root = vars(root_cls)[name]
        root_function = raw_root.__func__ if isinstance(raw_root, classmethod) else raw_root
        signature = inspect.signature(root_function)  # the contract's names for the arguments
        implementation = inspect.getattr_static(base, name)
        if info["kind"] == "classmethod":
            function = implementation.__func__
            namespace[name] = classmethod(
                functools.wraps(function)(recorded_call("S", name, signature, function, skip=("cls",)))
            )
        elif info["kind"] == "context manager":

            def make(implementation=implementation, name=name, signature=signature):
                inner = recorded_call("S", name, signature, implementation)

                @functools.wraps(implementation)
                def wrapper(*args, **kwargs):
                    context = inner(*args, **kwargs)
                    return _RecordedContext(context, name) if RECORDER.active else context

                return wrapper

            namespace[name] = make()
        else:
            namespace[name] = functools.wraps(implementation)(recorded_call("S", name, signature, implementation))
    for name in properties:
        parent = next(inspect.getattr_static(c, name) for c in base.__mro__ if name in vars(c))

        def make_property(parent=parent, name=name):
            def getter(self):
                if not RECORDER.active:
                    return parent.fget(self)
                RECORDER.property_reads[name] += 1
                if name not in FLAG_PROPERTIES:
                    return parent.fget(self)
                index = RECORDER.add(f"S.{name} read")
                value = parent.fget(self)
                RECORDER.append_to(index, f" -> {describe(value)}")
                return value

            setter = None
            if parent.fset is not None:

                def setter(self, value):
                    if RECORDER.active:
                        RECORDER.add(f"S.{name} = {describe(value)}")
                    parent.fset(self, value)

            return property(getter, setter, doc=parent.__doc__)

        namespace[name] = make_property()
    return type(f"Recording{base.__name__}", (base,), namespace)


def with_recorded_hooks(base: type, hooks: tuple[str, ...], prefix: str, skip: tuple[str, ...]) -> type:
    """A subclass of ``base`` whose named hooks record their call, then run the parent's."""
    namespace: dict[str, Any] = {"__module__": __name__}
    for name in hooks:
        implementation = getattr(base, name)
        signature = inspect.signature(implementation)
        namespace[name] = functools.wraps(implementation)(recorded_call(prefix, name, signature, implementation, skip))
    return type(f"Recording{base.__name__}", (base,), namespace)


# ----------------------------------------------------------------------------------------------------
# The model, data and one stage's run (in the worker processes).


def build_model_class(lightning_module: type) -> type:
    from torch.utils.data import DataLoader, Dataset

    class RandomVectors(Dataset):
        def __init__(self) -> None:
            self.data = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.data)

        def __getitem__(self, index: int) -> torch.Tensor:
            return self.data[index]

    class HookModel(lightning_module):
        """A BoringModel-like module: one Linear layer, MSE against ones."""

        def __init__(self, fail_at: tuple[int, int] | None = None) -> None:
            super().__init__()
            self.fail_at = fail_at
            self.layer: torch.nn.Module | None = None

        def configure_model(self) -> None:
            if self.layer is None:
                self.layer = torch.nn.Linear(32, 2)

        def _loss(self, batch: torch.Tensor) -> torch.Tensor:
            out = self.layer(batch)
            return torch.nn.functional.mse_loss(out, torch.ones_like(out))

        def training_step(self, batch, batch_idx):
            if self.fail_at == (self.current_epoch, batch_idx):
                raise RuntimeError(f"training_step fails at epoch {self.current_epoch} batch {batch_idx}")
            loss = self._loss(batch)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch), sync_dist=True)

        def test_step(self, batch, batch_idx):
            loss = self._loss(batch)
            self.log("test_loss", loss, sync_dist=True)
            # LightningModule.all_gather calls the strategy's
            self.log("test_loss_max", self.all_gather(loss).max())

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return self.layer(batch)

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)}

        def train_dataloader(self):
            return DataLoader(RandomVectors(), batch_size=2)

        def val_dataloader(self):
            return DataLoader(RandomVectors(), batch_size=2)

        def test_dataloader(self):
            return DataLoader(RandomVectors(), batch_size=2)

        def predict_dataloader(self):
            return DataLoader(RandomVectors(), batch_size=2)

    return HookModel


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

    global ROOT
    ROOT = root
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
    options: dict[str, Any] = dict(
        max_epochs=3 if stage == "fit_resumed" else 1 if stage == "fit_accumulate" else 2,
        limit_train_batches=4 if stage == "fit_accumulate" else 3,
        limit_val_batches=2,
        limit_test_batches=2,
        limit_predict_batches=2,
        accumulate_grad_batches=2 if stage == "fit_accumulate" else 1,
    )
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


def hook_name(event: str) -> str | None:
    """``S.optimizer_step(...)`` -> ``optimizer_step``; None for other events."""
    match = re.match(r"S\.(\w+)\(", event.strip())
    return match.group(1) if match else None


def derive(events: list[str]) -> dict[str, Any]:
    """Counts per Strategy hook: every call, and those made from inside another Strategy hook."""
    counts: Counter[str] = Counter()
    nested: Counter[str] = Counter()
    strategy_depths: list[int] = []  # indentation of the enclosing Strategy calls
    for event in events:
        depth = (len(event) - len(event.lstrip(" "))) // 2
        while strategy_depths and strategy_depths[-1] >= depth:
            strategy_depths.pop()
        name = hook_name(event)
        if name is None:
            continue
        counts[name] += 1
        if strategy_depths:
            nested[name] += 1
        strategy_depths.append(depth)
    return {"counts": dict(sorted(counts.items())), "counts_from_strategy_hooks": dict(sorted(nested.items()))}


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
