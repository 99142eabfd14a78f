"""Running a snippet under the reference Lightning, to compare torchfleet's results with Lightning's.

The Lightning environment is found at ``TF_LIGHTNING_PYTHON`` (default /work/venv-lightning/bin/python);
tests that need it are marked ``needs_lightning`` and skipped, with the reason, where it is absent.
"""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

LIGHTNING_PYTHON = os.environ.get("TF_LIGHTNING_PYTHON", "/work/venv-lightning/bin/python")
needs_lightning = pytest.mark.skipif(
    not os.path.exists(LIGHTNING_PYTHON),
    reason=f"no Lightning environment at {LIGHTNING_PYTHON} (set TF_LIGHTNING_PYTHON) to compare with")


def run_in_lightning(code: str, timeout: float = 240) -> str:
    """Run ``code`` (dedented) with Lightning's Python in a clean environment; return what it printed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_GLOBAL_SEED", "PL_GLOBAL_SEED")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([LIGHTNING_PYTHON, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout
