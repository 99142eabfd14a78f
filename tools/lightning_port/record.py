"""A pytest plugin that appends every test's outcome to a JSON-lines file as it happens (``-p lightning_port_record``).

Line by line, so that a pytest process that dies (a crash, the per-file time limit) still leaves the outcomes
of the tests it finished. The file is named by the environment variable ``LIGHTNING_PORT_RECORD``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _message(report: Any) -> str:
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message
    text = str(longrepr)
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    return errors[-1] if errors else text.strip().splitlines()[-1] if text.strip() else ""


def _write(entry: dict) -> None:
    path = os.environ.get("LIGHTNING_PORT_RECORD")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def _touched() -> list[str]:
    """The Lightning names without a torchfleet counterpart that the running test used (ported runs only)."""
    names = sys.modules.get("lightning_port_names")
    return names.TOUCHED if names is not None else []


def pytest_runtest_setup(item: Any) -> None:
    _touched().clear()


def pytest_runtest_logreport(report: Any) -> None:
    outcome = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    if report.when == "call" or outcome != "passed":
        entry = {"nodeid": report.nodeid, "when": report.when, "outcome": outcome, "message": _message(report),
                 "duration": round(report.duration, 3)}
        if outcome == "failed" and _touched():
            entry["missing"] = sorted(set(_touched()))
        _write(entry)


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _write({"nodeid": report.nodeid, "when": "collect", "outcome": "failed", "message": _message(report)})
