"""Record what the ported programs (tests/ported) end with under Lightning, as the fixture CI compares with.

Run from the repository root with this project's Python; the programs themselves run under the reference
Lightning's interpreter::

    python tools/record_lightning_ported.py --lightning-python /work/venv-lightning/bin/python

For each mode Lightning runs on a CPU ("single": one process; "ddp": 2 processes over gloo) it writes the
programs with their import lines turned back to Lightning's (tests/ported/lightning_imports.py), runs them
as one launch and saves what rank 0 ended with (final weights, metrics, the programs' other values) to
``tests/fixtures/lightning_ported/<mode>.pt``, with the versions it was recorded with under ``"_meta"``.
tests/ported/test_lightning_parity.py compares torchfleet's runs with these files within 1e-5 (relative),
and, where Lightning is installed, bitwise with a live Lightning run. Re-record after changing a program.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.ported import parity  # noqa: E402

LIGHTNING_MODES = ("single", "ddp")


def _lightning_version(python: str) -> str:
    code = "import lightning; print(lightning.__version__)"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lightning-python", default="/work/venv-lightning/bin/python")
    parser.add_argument("--modes", nargs="*", default=list(LIGHTNING_MODES), choices=LIGHTNING_MODES)
    args = parser.parse_args()
    meta = {"lightning": _lightning_version(args.lightning_python), "torch": str(torch.__version__),
            "machine": platform.machine(), "processor": platform.processor() or "unknown"}
    os.makedirs(parity.FIXTURES, exist_ok=True)
    for mode in args.modes:
        with tempfile.TemporaryDirectory() as folder:
            results = parity.launch(mode, folder, python=args.lightning_python)
        results["_meta"] = meta
        torch.save(results, parity.fixture_path(mode))
        size = os.path.getsize(parity.fixture_path(mode))
        print(f"{mode}: {', '.join(k for k in results if k != '_meta')} -> {parity.fixture_path(mode)} ({size} bytes)")


if __name__ == "__main__":
    main()
