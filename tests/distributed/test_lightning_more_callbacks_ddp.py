"""GradientAccumulationScheduler, BasePredictionWriter and StochasticWeightAveraging under ddp on 2 real processes, in
one launch (tests/lightning_more_programs.py's DDP program runs all three in the same 2 processes): the same numbers
as Lightning 2.6.6 on every rank, and without Lightning what each must give."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.lightning_more_programs import source
from tests.lightning_reference import LIGHTNING_PYTHON, needs_lightning

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _launch(python: str, library: str, folder, env: dict) -> subprocess.Popen:
    folder.mkdir()
    script = folder / "program.py"
    script.write_text(source(library, "ddp"))
    return subprocess.Popen([python, str(script), str(folder)], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _ranks(proc: subprocess.Popen, folder) -> list[dict]:
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-4000:]
    return [json.loads((folder / f"ranks-{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """torchfleet's launch, shared by the tests of this file (its results per rank)."""
    folder = tmp_path_factory.mktemp("launch") / "torchfleet"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")])}
    return _ranks(_launch(sys.executable, "torchfleet", folder, env), folder)


def test_each_callback_gives_what_it_must_on_every_rank(ours):
    ranks = ours
    # 40 samples, batches of 4, 2 ranks: 5 batches a rank; accumulating 1, 2, 3: 5, 3 and 2 steps
    assert [r["accumulation"]["epochs"] for r in ranks] == [[5, 8, 10]] * 2
    assert ranks[0]["accumulation"]["weights"] == ranks[1]["accumulation"]["weights"]
    # the writer's shards: each rank's indices, together every sample of the 13 once
    indices = [[i for batch in r["writer"]["batches"] for i in batch[0]] for r in ranks]
    assert sorted(indices[0] + indices[1]) == list(range(13))
    assert [r["writer"]["epoch"][0] for r in ranks] == [[[b[0] for b in r["writer"]["batches"]]] for r in ranks]
    # SWA from epoch 2 of 4: 3 epochs' starting weights averaged, the same on both ranks
    assert [r["swa"]["n_averaged"] for r in ranks] == [3, 3]
    assert ranks[0]["swa"]["weights"] == ranks[1]["swa"]["weights"]
    assert all(torch.isfinite(torch.tensor(w)).all() for w in ranks[0]["swa"]["weights"])


@needs_lightning
def test_every_rank_equals_lightnings_bitwise(tmp_path, ours):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_GLOBAL_SEED", "PL_GLOBAL_SEED")}
    env["OMP_NUM_THREADS"] = "1"
    assert ours == _ranks(_launch(LIGHTNING_PYTHON, "lightning", tmp_path / "lightning", env), tmp_path / "lightning")
