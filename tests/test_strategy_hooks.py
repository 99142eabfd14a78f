"""A strategy written against Lightning's signatures, recorded under torchfleet's Trainer in every stage of the Lightning
recording (one process), against Lightning 2.6.6's own order and counts (tests/fixtures/lightning_strategy_hooks.json).

tests/strategy_hooks.py builds the recorder and the comparable form; tests/distributed/test_strategy_hooks_ddp.py
does the same with ddp on 2 processes. What is compared, and the deliberate differences: ``strategy_hooks.DELIBERATE``
and docs/strategy_hooks.md.
"""

from __future__ import annotations

import glob
import logging
import os

import pytest
import torch

from tests import strategy_hooks as sh
from torchfleet.strategies import SingleDeviceStrategy


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, list[str]]:
    """Every stage in order (the resumed fit resumes from the fit's last checkpoint), as the Lightning recording."""
    root = str(tmp_path_factory.mktemp("hooks"))
    cls = sh.recorder_class(SingleDeviceStrategy, "single")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    logging.getLogger("torchfleet").setLevel(logging.ERROR)
    try:
        out = {}
        for stage in sh.STAGES:
            ckpt = glob.glob(os.path.join(root, "fit", "*.ckpt"))[0] if stage == "fit_resumed" else None
            out[stage] = sh.run_stage("single", stage, root, cls(device="cpu"), 1, ckpt)
    finally:
        torch.set_num_threads(threads)
        logging.getLogger("torchfleet").setLevel(logging.INFO)
    return out


@pytest.mark.parametrize("stage", sh.STAGES)
def test_strategy_calls_match_lightnings_order_nesting_and_counts(recorded, stage):
    sh.assert_matches(recorded[stage], "single", stage)


def test_the_recording_sees_the_strategy_hooks_lightning_calls(recorded):
    """Not a comparison of empty lists: each hook Lightning's one-process Trainer calls was called here too (but
    broadcast and reduce, which torchfleet needs only between processes: see DELIBERATE's "collectives")."""
    expected = {sh.TOOL.hook_name(e) for stage in sh.STAGES for e in sh.lightning_events("single", stage)} - {None}
    called = {sh.TOOL.hook_name(e) for events in recorded.values() for e in events} - {None}
    assert expected - {"broadcast", "reduce"} == called
    assert {"optimizer_step", "training_step", "backward", "on_exception", "teardown", "load_optimizer_state_dict",
            "setup_optimizers", "model_sharded_context"} <= called


def test_collectives_bind_to_lightnings_signatures(recorded):
    """barrier, broadcast, reduce and all_gather are called at torchfleet's own points (DELIBERATE), with arguments
    that Lightning's signatures bind (the recorder binds every call to them)."""
    calls = [c for events in recorded.values() for c in sh.comparable(events)["collectives"]]
    assert calls and all("does not bind" not in c for c in calls)
    assert any(c.startswith("S.all_gather(tensor:") for c in calls)  # the test_step's self.all_gather
