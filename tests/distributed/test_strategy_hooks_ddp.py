"""Lightning's Strategy contract under torchfleet's Trainer with ddp on 2 real processes (gloo), every stage of the
Lightning recording, both ranks, against Lightning 2.6.6's order and counts (tests/fixtures/lightning_strategy_hooks.json).

scripts/strategy_hooks_ddp.py runs the stages (one launch: ddp re-runs it for rank 1); tests/strategy_hooks.py
holds the recorder and the comparison (the one-process counterpart is tests/test_strategy_hooks.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import strategy_hooks as sh
from tests.distributed.test_ddp import ROOT, pythonpath

pytestmark = [pytest.mark.distributed]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "strategy_hooks_ddp.py")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[tuple[str, int], list[str]]:
    out = tmp_path_factory.mktemp("hooks_ddp")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    proc = subprocess.run([sys.executable, SCRIPT, json.dumps({"out": str(out)})], capture_output=True, text=True,
                          timeout=300, env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()}, cwd=ROOT)
    records = {}
    for stage in sh.STAGES:
        for rank in (0, 1):
            path = out / f"{stage}-rank{rank}.json"
            assert path.exists(), f"{path.name} missing; the run said:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
            records[(stage, rank)] = json.loads(path.read_text())
    return records


@pytest.mark.parametrize("stage", sh.STAGES)
@pytest.mark.parametrize("rank", [0, 1])
def test_strategy_calls_match_lightnings_on_every_rank(recorded, stage, rank):
    sh.assert_matches(recorded[(stage, rank)], "ddp", stage, rank)


def test_ddp_only_hooks_are_called(recorded):
    """configure_ddp (fit only, as Lightning), block_backward_sync (accumulation), setup_distributed, set_world_ranks."""
    def count(stage: str, name: str) -> int:
        return sum(sh.TOOL.hook_name(e) == name for e in recorded[(stage, 0)])

    assert [count(s, "configure_ddp") for s in sh.STAGES] == [1, 0, 0, 0, 1, 1, 1]
    assert count("fit_accumulate", "block_backward_sync") == 2 and count("fit", "block_backward_sync") == 0
    assert all(count(s, "setup_distributed") == 1 for s in sh.STAGES)
