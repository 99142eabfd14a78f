"""A Precision plugin and an Accelerator written against Lightning's signatures, recorded under torchfleet's Trainer
and compared with Lightning 2.6.6's own calls (tests/fixtures/lightning_plugin_hooks.json, written by
tools/record_lightning_plugin_hooks.py): which hooks exist, the arguments they get (bound to Lightning's
signatures), their order and counts per stage. ``DELIBERATE`` names what differs on purpose; docs/plugin_hooks.md
repeats it with the figures.
"""

from __future__ import annotations

import collections
import glob
import inspect
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import strategy_hooks as sh
from torchfleet.accelerators import CPUAccelerator
from torchfleet.plugins import Precision

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "lightning_plugin_hooks.json"
STAGES = ("fit", "validate", "test", "predict", "fit_resumed", "fit_clip_norm", "fit_clip_value")
TOOL = sh.TOOL

#: hooks whose calls differ from Lightning's on purpose (name -> why); they are left out of the order comparison.
#: (Lightning's pre_backward/post_backward call on_before/after_backward themselves; torchfleet's Trainer calls them
#: between the precision's calls: the comparison takes the plugin's calls without their nesting.)
DELIBERATE: dict[str, str] = {}


def fixture() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def recorder(base: type, kind: str, prefix: str) -> type:
    """A subclass of the torchfleet class ``base`` recording each method of Lightning's ``kind`` contract it has."""
    methods = {}
    for name, info in fixture()["contract"][kind].items():
        if info["kind"] == "staticmethod" and not isinstance(inspect.getattr_static(base, name, None), staticmethod):
            continue  # e.g. Accelerator.name: a string that is also callable here (checked on its own below)
        if hasattr(base, name):
            methods[name] = (info["kind"], TOOL.signature_from_text(info["signature"]))
    return TOOL.build_recorder_class(base, methods, [], prefix=prefix)


def run_stage(stage: str, root: str, ckpt_path: str | None) -> list[str]:
    """One stage as tools/record_lightning_plugin_hooks.py ran it under Lightning; returns the events."""
    import torchfleet as tf
    from torchfleet.callbacks import ModelCheckpoint

    rec = TOOL.RECORDER
    model_class, callback_class = sh.start_recording(root)
    rec.add("== plugins constructed")
    precision = recorder(Precision, "precision", "P")()
    accelerator = recorder(CPUAccelerator, "accelerator", "A")()
    options = TOOL.trainer_options("fit_resumed" if stage == "fit_resumed" else "fit")
    if stage.startswith("fit_clip"):
        options.update(max_epochs=1, gradient_clip_val=0.5,
                       gradient_clip_algorithm="value" if stage.endswith("value") else "norm")
    checkpoint = ModelCheckpoint(dirpath=os.path.join(root, stage), save_on_train_epoch_end=True)
    rec.add("== Trainer(...) called")
    trainer = tf.Trainer(accelerator=accelerator, devices="auto", plugins=[precision], logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[callback_class(), checkpoint], default_root_dir=root, **options)
    model = model_class()
    call = "fit" if stage.startswith("fit") else stage
    rec.add(f"== trainer.{call}(model) called")
    getattr(trainer, call)(model, ckpt_path=ckpt_path)
    rec.add(f"== trainer.{call} returned")
    rec.active = False
    return list(rec.events)


def plugin_events(events: list[str], prefix: str) -> list[str]:
    """The ``prefix`` plugin's calls in order, unindented (nesting among the Module's hooks differs: DELIBERATE),
    without the DELIBERATE hooks; dicts and context managers by kind (torchfleet's checkpoint holds other keys;
    its contexts are other classes)."""
    out = []
    for event in events:
        text = event.strip()
        if not text.startswith(prefix + "."):
            continue
        name = text[2:].split("(")[0].split(" ")[0]
        if name in DELIBERATE:
            continue
        text = re.sub(r"dict with keys \[[^]]*\]", "dict", text)
        out.append(re.sub(r"context manager \([^)]*\)", "context manager", text))
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, list[str]]:
    root = str(tmp_path_factory.mktemp("plugins"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    logging.getLogger("torchfleet").setLevel(logging.ERROR)
    try:
        out = {}
        for stage in STAGES:
            ckpt = glob.glob(os.path.join(root, "fit", "*.ckpt"))[0] if stage == "fit_resumed" else None
            out[stage] = run_stage(stage, root, ckpt)
    finally:
        torch.set_num_threads(threads)
        logging.getLogger("torchfleet").setLevel(logging.INFO)
    return out


def lightning(stage: str, prefix: str) -> list[str]:
    return plugin_events(fixture()["runs"][stage]["events"], prefix)


@pytest.mark.parametrize("stage", STAGES)
def test_precision_calls_match_lightnings_order_arguments_and_counts(recorded, stage):
    ours, theirs = plugin_events(recorded[stage], "P"), lightning(stage, "P")
    assert ours == theirs, "\n".join(difflib_lines(theirs, ours))


@pytest.mark.parametrize("stage", STAGES)
def test_accelerator_calls_match_lightnings_counts(recorded, stage):
    def counts(events):
        return collections.Counter(e.split("(")[0] for e in plugin_events(events, "A"))

    assert counts(recorded[stage]) == counts(fixture()["runs"][stage]["events"])


def test_every_lightning_precision_method_exists_with_a_signature_that_binds_lightnings_calls():
    contract = fixture()["contract"]["precision"]
    missing = sorted(name for name in contract if not hasattr(Precision, name))
    assert missing == []
    for name, info in contract.items():
        ours = inspect.signature(getattr(Precision, name))
        theirs = TOOL.signature_from_text(info["trainer_signature"])
        assert list(ours.parameters) == list(theirs.parameters), name


def test_the_accelerator_name_is_a_string_and_lightnings_static_method():
    assert CPUAccelerator.name == "cpu" and CPUAccelerator.name() == "cpu" and CPUAccelerator().name() == "cpu"


def difflib_lines(expected: list[str], got: list[str]) -> list[str]:
    import difflib

    return list(difflib.unified_diff(expected, got, "lightning", "torchfleet", lineterm="", n=2))


class _Tiny:
    """A one-layer Module and its loader for the behaviour tests below (built lazily: torchfleet imports inside)."""

    @staticmethod
    def fit(precision: Precision) -> tuple[torch.Tensor, torch.Tensor]:
        import torchfleet as tf

        class Tiny(tf.Module):
            def __init__(self) -> None:
                super().__init__()
                self.layer = torch.nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                return self.layer(batch).pow(2).mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

            def train_dataloader(self):
                return torch.utils.data.DataLoader(torch.ones(8, 4), batch_size=4)

        tf.seed_everything(3)
        model = Tiny()
        before = model.layer.weight.detach().clone()
        trainer = tf.Trainer(accelerator="cpu", devices=1, plugins=[precision], max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(model)
        return before, model.layer.weight.detach()


def test_what_a_precision_of_yours_returns_and_decides_is_what_the_trainer_uses():
    """pre_backward's tensor is the one backpropagated; optimizer_step decides whether the optimizer steps."""

    class NoGradient(Precision):
        def pre_backward(self, tensor, module):
            return tensor * 0.0

    before, after = _Tiny.fit(NoGradient())
    assert torch.equal(before, after)  # zero gradients: SGD without momentum leaves the weights as they were

    class NeverSteps(Precision):
        def optimizer_step(self, optimizer, model, closure, **kwargs):
            self.model_seen = type(model).__name__
            return closure()  # forward and backward, but no step

    precision = NeverSteps()
    before, after = _Tiny.fit(precision)
    assert torch.equal(before, after) and precision.model_seen == "Tiny"

    before, after = _Tiny.fit(Precision())  # the control: the same run with the plain plugin trains
    assert not torch.equal(before, after)
