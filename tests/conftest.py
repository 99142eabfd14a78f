"""Session fixtures shared by test files in several folders.

The model-parallel launches (tests/distributed/model_parallel_launches.py): one launch per world size serves
tests/strategies/test_model_parallel.py, test_pipeline.py, test_model_parallel_features.py and
tests/examples/test_tp_transformer.py; a test asks for the world sizes it reads, and each is launched at most once,
with the runs of the files this session collected (one file alone launches only its own runs).
"""

from __future__ import annotations

import os

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="session")
def model_parallel_parts(request) -> list[str]:
    """The parts whose test file this session collected (the same for every launch, so that each part's later
    launches find the checkpoints of its earlier ones)."""
    from tests.distributed.model_parallel_launches import READERS

    collected = {os.path.relpath(str(item.path), TESTS).replace(os.sep, "/") for item in request.session.items}
    return [part for part, reader in READERS.items() if reader in collected]


@pytest.fixture(scope="session")
def model_parallel_dirs(tmp_path_factory) -> dict[str, str]:
    """Each part's folder: its results files and checkpoints."""
    from tests.distributed.model_parallel_launches import PARTS

    return {part: str(tmp_path_factory.mktemp(part)) for part in PARTS}


@pytest.fixture(scope="session")
def four_process_runs(model_parallel_dirs, model_parallel_parts) -> dict[str, dict]:
    from tests.distributed.model_parallel_launches import launch

    return launch(4, model_parallel_dirs, timeout=1200, parts=model_parallel_parts)


@pytest.fixture(scope="session")
def one_process_runs(four_process_runs, model_parallel_dirs, model_parallel_parts) -> dict[str, dict]:
    """After the 4-process launch, whose checkpoints (and a consolidated copy of tp2dp2.ckpt) it resumes."""
    from tests.distributed.model_parallel_launches import launch
    from torchfleet.checkpoint.consolidate import consolidate

    if "model_parallel" in model_parallel_parts:
        d = model_parallel_dirs["model_parallel"]
        consolidate(f"{d}/tp2dp2.ckpt", f"{d}/consolidated.ckpt", with_optimizer=True)
    return launch(1, model_parallel_dirs, timeout=300, parts=model_parallel_parts)


@pytest.fixture(scope="session")
def two_process_runs(one_process_runs, model_parallel_dirs, model_parallel_parts) -> dict[str, dict]:
    """After the 1-process launch, whose pipeline checkpoints it resumes (and the 4-process ones)."""
    from tests.distributed.model_parallel_launches import launch

    return launch(2, model_parallel_dirs, timeout=300, parts=model_parallel_parts)


@pytest.fixture(scope="session")
def tp_transformer_reference() -> dict:
    """The tensor-parallel Transformer example trained in this process (single_device, float32, the global batch):
    the reference of test_tp_transformer.py's and test_model_parallel_features.py's runs."""
    from tests.distributed.scripts import tp_transformer_train as script

    return script.train({"name": "ref", "strategy": "single_device"}, 1)
