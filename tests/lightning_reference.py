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


def start_in_lightning(code: str) -> subprocess.Popen:
    """Start ``code`` (dedented) under Lightning's Python in a clean environment; :func:`finish` reads it.

    Starting it before running torchfleet's side of a comparison lets the two interpreters import torch at once."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_GLOBAL_SEED", "PL_GLOBAL_SEED")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen([LIGHTNING_PYTHON, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    """What a started program printed, once it ended with status 0."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-4000:]
    return out


def run_in_lightning(code: str, timeout: float = 240) -> str:
    """Run ``code`` (dedented) with Lightning's Python in a clean environment; return what it printed."""
    return finish(start_in_lightning(code), timeout)


def run_here(code: str) -> str:
    """What ``code`` (torchfleet's side of a comparison) prints, run in this process: torch is imported here already,
    where a new Python would import it again."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(textwrap.dedent(code), "<program>", "exec"), {"__name__": "__program__"})
    return out.getvalue()
