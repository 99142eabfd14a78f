"""tests/gpu: what only a machine with CUDA devices can check. Every test here carries the ``cuda`` marker.

Run on a GPU machine with ``python -m pytest tests/gpu -m cuda -v``; each test skips, saying
how many devices it needs, where they are absent (CI has none).
"""

from __future__ import annotations

import pytest
import torch


def cuda_count() -> int:
    """Visible CUDA devices, counted without starting the CUDA driver in the test process."""
    return torch.cuda.device_count()


def needs_cuda(n: int = 1, why: str = "") -> pytest.MarkDecorator:
    """Skip unless ``n`` CUDA devices are visible; the reason says what the test checks."""
    have = cuda_count()
    return pytest.mark.skipif(have < n, reason=f"needs {n} CUDA device(s), {have} here: {why}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/gpu/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.cuda)
