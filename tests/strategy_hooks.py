"""Recording Lightning's Strategy contract under torchfleet's Trainer, in the event format of the Lightning recording.

``tools/record_lightning_strategy_hooks.py`` ran Lightning 2.6.6's Trainer with recorder subclasses of its
strategies and wrote ``tests/fixtures/lightning_strategy_hooks.json``. Here the same tool's code
(tools/strategy_hooks_recording.py: ``describe``, ``recorded_call``, ``build_recorder_class``, the HookModel and
the recording Callback; it needs only torch)
builds recorder subclasses of torchfleet's ``SingleDeviceStrategy`` and ``DDPStrategy`` that override every
method of the contract with a recording one whose arguments are bound to **Lightning's** signature (read from
the JSON), and the four flag properties; then the same stages run under torchfleet's Trainer. ``compare``
puts both event lists in one comparable form and lists every difference; ``DELIBERATE`` names the
differences that are torchfleet's on purpose, each with its reason (docs/strategy_hooks.md repeats them).
"""

from __future__ import annotations

import collections
import difflib
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "lightning_strategy_hooks.json"
STAGES = ("fit", "validate", "test", "predict", "fit_resumed", "fit_fails", "fit_accumulate")


def load_tool() -> Any:
    """The recording tool's library (tools/strategy_hooks_recording.py: it needs only torch) as a module."""
    spec = importlib.util.spec_from_file_location("strategy_hooks_recording",
                                                  REPO / "tools" / "strategy_hooks_recording.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = load_tool()


def fixture() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


#: the contract classes each mode's Lightning strategy is built from (their methods are the ones it overrides)
_MODE_CLASSES = {"single": {"Strategy", "SingleDeviceStrategy"}, "ddp": {"Strategy", "ParallelStrategy", "DDPStrategy"}}
#: the properties whose writes and reads are recorded (reads of the flags are events; the others' writes are)
_PROPERTIES = ("model", "optimizers", "restore_checkpoint_after_setup", "lightning_restore_optimizer",
               "handles_gradient_accumulation")


def recorder_class(base: type, mode: str) -> type:
    """A subclass of the torchfleet strategy ``base`` recording each method of Lightning's contract for ``mode``."""
    contract = fixture()["contract"]
    methods = {
        name: (info["kind"], TOOL.signature_from_text(info["signature"]))
        for name, info in contract["methods"].items() if set(info["defined_in"]) & _MODE_CLASSES[mode]
    }
    properties = list(_PROPERTIES) + (["distributed_sampler_kwargs"] if mode == "ddp" else [])
    return TOOL.build_recorder_class(base, methods, properties)


def start_recording(root: str) -> tuple[type, type]:
    """A fresh recorder for a run in ``root``, the seed set; returns the recording HookModel and Callback classes."""
    import torchfleet as tf
    from torchfleet.callbacks import Callback

    TOOL.ROOT = root
    recorder = TOOL.RECORDER
    recorder.events.clear()
    recorder.property_reads.clear()
    recorder.depth, recorder.active = 0, True
    tf.seed_everything(TOOL.SEED)
    model_class = TOOL.with_recorded_hooks(TOOL.build_model_class(tf.Module), TOOL.MODULE_HOOKS, "M", ("self",))
    callback_class = TOOL.with_recorded_hooks(Callback, TOOL.CALLBACK_HOOKS, "C", ("self", "trainer", "pl_module"))
    return model_class, callback_class


def run_stage(mode: str, stage: str, root: str, strategy: Any, devices: int, ckpt_path: str | None = None) -> list[str]:
    """One stage as the Lightning recording ran it (``tools/record_lightning_strategy_hooks.py``: run_worker),
    under torchfleet's Trainer; returns this process's events."""
    import torchfleet as tf
    from torchfleet.callbacks import ModelCheckpoint

    recorder = TOOL.RECORDER
    model_class, callback_class = start_recording(root)
    recorder.add("== strategy constructed")
    options = TOOL.trainer_options(stage)
    checkpoint = ModelCheckpoint(dirpath=os.path.join(root, stage), save_on_train_epoch_end=True)
    recorder.add("== Trainer(...) called")
    trainer = tf.Trainer(accelerator="cpu", devices=devices, strategy=strategy, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[callback_class(), checkpoint], default_root_dir=root, **options)
    model = model_class(fail_at=(0, 1) if stage == "fit_fails" else None)
    call = "fit" if stage.startswith("fit") else stage
    recorder.add(f"== trainer.{call}(model{', ckpt_path=...' if ckpt_path else ''}) called")
    try:
        getattr(trainer, call)(model, ckpt_path=ckpt_path)
        recorder.add(f"== trainer.{call} returned")
    except Exception as error:  # the failing fit's (under ddp, rank 0 may report rank 1's failure instead)
        recorder.add(f"== trainer.{call} raised {TOOL.describe(error)}")
    recorder.active = False
    return list(recorder.events)


# ---------------------------------------------------------------------------------------------- comparing
#: collectives: the Trainer's own points differ on purpose (see DELIBERATE); compared by binding only
COLLECTIVES = ("barrier", "broadcast", "reduce", "all_gather")
#: property writes kept in the comparison: where the contract gives them their meaning
_WRITES_KEPT_IN = ("configure_ddp", "teardown")

DELIBERATE = {
    "collectives": (
        "barrier, broadcast, reduce and all_gather are called at torchfleet's own points (its named barriers; "
        "the loops' shape agreed in one all_gather where Lightning reduces each loader's length; every "
        "sync_dist value of one logging point in one reduce, not one per name), so they are compared by their "
        "arguments binding to Lightning's signatures, not by place or count."),
    "loaders_before_setup": (
        "process_dataloader (after the distributed_sampler_kwargs read) runs for the stage's loaders before "
        "setup(trainer), not when the loops start: the loop shape is agreed then, and configure_optimizers may "
        "read trainer.estimated_stepping_batches. Compared on their own: the same calls, in the same order "
        "(validation's loader before the training one)."),
    "gradient_accumulation_flag": (
        "handles_gradient_accumulation is read once per fit (the per-batch path is decided once), where "
        "Lightning reads it several times a batch."),
    "property_writes": (
        "the writes of model and optimizers inside setup(trainer) (Lightning's precision conversion and "
        "_setup_model assign them more often) are not compared, except in configure_ddp (the wrapper) and "
        "teardown (the unwrapped Module); tests check model and optimizers after setup instead."),
    "argument_kinds": (
        "argument descriptions are compared by kind: a DataLoader without its sampler class (torchfleet's "
        "evaluation shards are exact, ExactDistributedSampler), a dict without its keys (torchfleet's "
        "checkpoint holds more entries), torch's ReduceOp and its name alike."),
}


def _depth(event: str) -> int:
    return (len(event) - len(event.lstrip(" "))) // 2


def _kind(description: str) -> str:
    description = description.strip()
    if description.startswith("DataLoader("):
        return "DataLoader"
    if description.startswith("dict"):
        return "dict"
    if description.startswith("ReduceOp."):
        return "str " + repr(description.split(".", 1)[1].lower())
    return description


def _normalise_call(event: str) -> str:
    """``S.name(args) -> ret`` with each argument and the return value reduced to its kind (see ``_kind``)."""
    body = event.strip()
    raised = " !! raised" in body
    body = body.split(" !! raised", 1)[0]
    match = re.match(r"([SMC])\.(\w+)\(", body)
    if match is None:
        return body
    prefix, name = match.groups()
    if prefix != "S":
        return f"{prefix}.{name}"  # Module and Callback hooks place the strategy's calls: their names suffice
    depth, close = 0, len(body)
    for index in range(match.end() - 1, len(body)):  # the parenthesis that closes the call's
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(body[index], 0)
        if depth == 0:
            close = index
            break
    arguments, rest = body[match.end():close], body[close + 1:]
    parts = []
    for part in _split_arguments(arguments):
        if part.startswith("*"):
            parts.append("*" + _kind(part[1:]))
            continue
        key, sep, value = re.match(r"(\w+)(: |=)(.*)$", part).groups()  # type: ignore[union-attr]
        parts.append(f"{key}{sep}{_kind(value)}")
    out = f"S.{name}({', '.join(parts)})"
    if rest.startswith(" -> "):
        out += f" -> {_kind(rest[4:])}"
    return out + (" !! raised" if raised else "")


def _split_arguments(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def comparable(events: list[str]) -> dict[str, Any]:
    """The parts of one process's events that are compared: ``sequence`` (strategy calls with their nesting, the
    flag reads, the Module's and Callbacks' hooks as markers), ``loaders`` (the process_dataloader calls in order),
    ``collectives`` (their calls), ``accumulation_reads`` and ``unbound`` (calls whose arguments did not bind)."""
    start = next(i for i, e in enumerate(events) if e.startswith("== trainer.") and e.endswith("called"))
    end = next((i for i, e in enumerate(events) if i > start and e.startswith("== trainer.")), len(events))
    sequence, loaders, collectives, unbound = [], [], [], []
    accumulation_reads = 0
    skip_below: int | None = None
    parents: list[tuple[int, str]] = []
    for event in events[start + 1:end]:
        depth = _depth(event)
        if skip_below is not None and depth > skip_below:
            continue
        skip_below = None
        while parents and parents[-1][0] >= depth:
            parents.pop()
        text = event.strip()
        if "<does not bind" in text:
            unbound.append(text)
        name = TOOL.hook_name(text)
        if name in COLLECTIVES:
            collectives.append(_normalise_call(text))
            skip_below = depth
            continue
        if name == "process_dataloader":
            loaders.append(_normalise_call(text))
            continue
        if text.startswith("S.distributed_sampler_kwargs read"):
            loaders.append(text)
            continue
        if text.startswith("S.handles_gradient_accumulation read"):
            accumulation_reads += 1
            continue
        if re.match(r"S\.\w+ = ", text):
            if parents and parents[-1][1] in _WRITES_KEPT_IN:
                sequence.append("  " * len(parents) + text)
            continue
        if name is not None:
            parents.append((depth, name))
        sequence.append("  " * len(parents[:-1] if name is not None else parents) + _normalise_call(text))
    return {"sequence": sequence, "loaders": loaders, "collectives": collectives,
            "accumulation_reads": accumulation_reads, "unbound": unbound}


def figures(expected: list[str], got: list[str]) -> dict[str, Any]:
    """How far two sequences agree: events in both (in order), and the strategy hooks whose counts agree."""
    matcher = difflib.SequenceMatcher(a=expected, b=got, autojunk=False)
    matched = sum(block.size for block in matcher.get_matching_blocks())

    def counts(sequence: list[str]) -> collections.Counter[str]:
        return collections.Counter(TOOL.hook_name(e) for e in sequence if TOOL.hook_name(e))

    want, have = counts(expected), counts(got)
    hooks = sorted(set(want) | set(have))
    return {"events_expected": len(expected), "events_got": len(got), "events_matched": matched,
            "hooks": len(hooks), "hooks_matching_counts": sum(want[h] == have[h] for h in hooks),
            "hook_counts_differ": {h: (want[h], have[h]) for h in hooks if want[h] != have[h]}}


def diff(expected: list[str], got: list[str]) -> str:
    return "\n".join(difflib.unified_diff(expected, got, "lightning", "torchfleet", lineterm="", n=2))


def lightning_events(mode: str, stage: str, rank: int = 0) -> list[str]:
    return fixture()["runs"][mode][stage][str(rank)]["events"]


def assert_matches(events: list[str], mode: str, stage: str, rank: int = 0) -> dict[str, Any]:
    """``events`` (one process's, of ``stage``) against Lightning's: every call bound to Lightning's signature, the
    compared sequence equal, the loaders' calls equal, the accumulation flag read once per fit. Returns the figures."""
    check_bindings(events)
    want = comparable(lightning_events(mode, stage, rank))
    got = comparable(events)
    assert got["sequence"] == want["sequence"], diff(want["sequence"], got["sequence"])
    numbers = figures(want["sequence"], got["sequence"])
    assert numbers["events_matched"] == numbers["events_expected"] == numbers["events_got"] > 20
    assert numbers["hooks_matching_counts"] == numbers["hooks"]
    # the loaders: the same process_dataloader calls in the same order (before setup: DELIBERATE)
    assert got["loaders"] == want["loaders"]
    # read when the step is built and once per epoch (after on_train_epoch_start, where GradientAccumulationScheduler
    # sets accumulate_grad_batches), where Lightning reads it several times a batch (DELIBERATE)
    epochs = sum(s.strip() == "M.on_train_epoch_start" for s in want["sequence"])
    assert got["accumulation_reads"] == (epochs + 1 if stage.startswith("fit") else 0) < want["accumulation_reads"] + 1
    return numbers


def check_bindings(events: list[str]) -> None:
    """Every recorded strategy call bound to Lightning's signature (else the recorder wrote ``<does not bind``)."""
    unbound = [e.strip() for e in events if "<does not bind" in e]
    assert not unbound, "calls that Lightning's signatures cannot bind:\n" + "\n".join(unbound)


def describe_tensor(value: torch.Tensor) -> str:
    return TOOL.describe(value)
