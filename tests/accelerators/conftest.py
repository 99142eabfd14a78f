"""Fixtures that make torch see a chosen number of CUDA devices on a CPU-only machine."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


@pytest.fixture
def cuda_count(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """Call with n: torch.cuda reports n devices (available when n > 0). Nothing is allocated."""

    def set_count(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    set_count(0)
    return set_count


@pytest.fixture
def mps(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """Call with True/False: torch.backends.mps reports MPS available or not."""

    def set_mps(available: bool) -> None:
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: available)

    set_mps(False)
    return set_mps
