"""conftest.py of the ported Lightning tests (written by tools/port_lightning_tests.py; not Lightning's own).

It gives the fixtures and helper functions Lightning's tests ask their conftest for, each doing to torchfleet
what Lightning's does to Lightning: ``cuda_count_2`` makes torchfleet see two CUDA devices, ``mps_count_1`` one
MPS device. XLA/TPU fixtures skip the test: torchfleet has no XLA accelerator (a deliberate absence). After
every test the environment, the rank and the process group are put back, so tests do not leak into each other.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
import torch.distributed


def mock_cuda_count(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    import torchfleet.accelerators.cuda as cuda

    monkeypatch.setattr(cuda, "cuda_device_count", lambda: n)


def mock_mps_count(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    import torchfleet.accelerators.mps as mps

    monkeypatch.setattr(mps, "_mps_available", lambda: n > 0)


def mock_xla_available(monkeypatch: pytest.MonkeyPatch, value: bool = True) -> None:
    pytest.skip("XLA: torchfleet has no XLA accelerator or strategy")


def mock_tpu_available(monkeypatch: pytest.MonkeyPatch, value: bool = True) -> None:
    pytest.skip("TPU: torchfleet has no XLA accelerator or strategy")


def _count_fixture(mock, n):
    @pytest.fixture
    def fixture(monkeypatch):
        mock(monkeypatch, n)

    return fixture


cuda_count_0 = _count_fixture(mock_cuda_count, 0)
cuda_count_1 = _count_fixture(mock_cuda_count, 1)
cuda_count_2 = _count_fixture(mock_cuda_count, 2)
cuda_count_4 = _count_fixture(mock_cuda_count, 4)
mps_count_0 = _count_fixture(mock_mps_count, 0)
mps_count_1 = _count_fixture(mock_mps_count, 1)
xla_available = _count_fixture(mock_xla_available, True)
tpu_available = _count_fixture(mock_tpu_available, True)


@pytest.fixture(scope="session")
def datadir() -> Path:
    return Path(__file__).resolve().parent.parent / "Datasets"


@pytest.fixture(autouse=True)
def _restore_environment():
    before = os.environ.copy()
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(autouse=True)
def _restore_rank():
    from torchfleet.utilities import rank_zero_only

    rank = rank_zero_only._rank
    yield
    rank_zero_only._rank = rank


@pytest.fixture(autouse=True)
def _teardown_process_group():
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(autouse=True)
def _reset_deterministic():
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture
def caplog(caplog):
    """Lightning's tests read torchfleet's log records through caplog: let them reach the root logger."""
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.startswith("torchfleet")]
    before = [(lg, lg.propagate) for lg in [logging.getLogger("torchfleet"), *loggers]]
    for lg, _ in before:
        lg.propagate = True
    yield caplog
    for lg, propagate in before:
        lg.propagate = propagate


@pytest.fixture
def single_process_pg():
    """A gloo process group of this one process for the test's duration."""
    from torchfleet.environments import find_free_port

    before = os.environ.copy()
    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(find_free_port()), RANK="0", WORLD_SIZE="1")
    torch.distributed.init_process_group("gloo")
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(before)
