"""Tally the recorded outcomes of a port run: per test, per file, and the failures grouped by first line."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_TMP = re.compile(r"/tmp/[^\s'\"),]+")


def read_records(records: Path, rel: str) -> tuple[dict[str, dict], str | None, str]:
    """Outcome per test of one file, the collection error (if the file could not be imported), the run's log tail."""
    name = rel.replace("/", "__")
    path, log = records / f"{name}.jsonl", records / f"{name}.log"
    tests: dict[str, dict] = {}
    collect_error = None
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    for line in lines:
        entry = json.loads(line)
        if entry["when"] == "collect":
            collect_error = entry["message"] or "collection failed"
            continue
        test = tests.setdefault(entry["nodeid"], {"outcome": "passed", "message": ""})
        outcome = entry["outcome"]
        if outcome == "failed":
            outcome = "failed" if entry["when"] == "call" else "error"
        if test["outcome"] in ("failed", "error") and outcome not in ("failed", "error"):
            continue  # a failure at setup/call outranks what teardown said
        if outcome != "passed" or test["outcome"] == "passed":
            test.update(outcome=outcome, message=entry["message"])
            if entry.get("missing"):
                test["missing"] = entry["missing"]
    return tests, collect_error, log.read_text() if log.is_file() else ""


def first_line(message: str) -> str:
    """The group key of a failure: its first non-empty line, without addresses and temporary paths."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = lines[0] if lines else "(no message)"
    if text == "AssertionError: Regex pattern did not match." and len(lines) > 1:
        text = f"pytest.raises(match=...) did not match: {lines[1]}"  # the expected message is the cause
    return _TMP.sub("<tmp>", _ADDRESS.sub("0x…", text))[:220]


def tally(files: list[str], records: Path, reference: Path | None) -> dict:
    tests: dict[str, dict] = {}
    per_file: dict[str, Counter] = {}
    extra = 0
    for rel in files:
        if not (records / (rel.replace("/", "__") + ".log")).is_file():
            continue  # not run (yet): a run with --only leaves the other files out of the tally
        got, collect_error, log = read_records(records, rel)
        want = read_records(reference, rel)[0] if reference is not None else {}
        if collect_error is not None:
            reason = f"collection: {collect_error}"
            got = {nodeid: {"outcome": "error", "message": reason} for nodeid in (want or {rel: None})}
        for nodeid in want:
            if nodeid not in got:
                why = "the file's run ended early" if "stopped" in log else "not collected under torchfleet"
                got[nodeid] = {"outcome": "error", "message": f"{why} (the test id exists under Lightning)"}
        if want:
            # Lightning's test ids are the selection: an id only torchfleet's run has (a parametrize list that
            # ported to other values) stands for one that is then counted as not collected
            extra += sum(1 for nodeid in got if nodeid not in want)
            got = {nodeid: result for nodeid, result in got.items() if nodeid in want}
        if not got:
            got = {rel: {"outcome": "error", "message": f"no outcome recorded: {first_line(log[-500:])}"}}
        counts = Counter()
        for nodeid, result in got.items():
            result["file"] = rel
            if nodeid in want:
                result["lightning"] = want[nodeid]["outcome"]
            counts[result["outcome"]] += 1
            tests[nodeid] = result
        per_file[rel] = counts
    totals = Counter()
    for counts in per_file.values():
        totals.update(counts)
    groups: dict[str, dict] = defaultdict(lambda: {"count": 0, "files": Counter(), "tests": []})
    for nodeid, result in tests.items():
        if result["outcome"] in ("failed", "error"):
            # a test that used a name torchfleet lacks failed for that reason, whatever its last error says
            key = (f"uses {', '.join(result['missing'])}, which torchfleet lacks" if result.get("missing")
                   else first_line(result["message"]))
            group = groups[key]
            group["count"] += 1
            group["files"][result["file"]] += 1
            group["tests"].append(nodeid)
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1]["count"], kv[0]))
    summary = {k: totals.get(k, 0) for k in OUTCOMES}
    summary["total"] = sum(totals.values())
    summary["runnable"] = summary["total"] - summary["skipped"]
    summary["ids_only_under_torchfleet"] = extra
    if reference is not None:
        summary["passed_under_lightning"] = sum(1 for t in tests.values() if t.get("lightning") == "passed")
        # the headline: of the tests Lightning itself passes on this machine, how many torchfleet passes
        summary["passed_of_those"] = sum(1 for t in tests.values()
                                         if t.get("lightning") == "passed" and t["outcome"] == "passed")
    return {
        "totals": summary,
        "files": {rel: {k: c.get(k, 0) for k in OUTCOMES} for rel, c in per_file.items()},
        "groups": [{"message": m, "count": g["count"], "files": dict(g["files"]), "tests": g["tests"]}
                   for m, g in ordered],
        "tests": tests,
    }


def write_tally(result: dict, out: Path) -> None:
    (out / "tally.json").write_text(json.dumps(result, indent=1))
    t = result["totals"]
    lines = [
        f"# Lightning's ported tests against torchfleet {result['torchfleet']}",
        "",
        (f"Lightning tests: {result['lightning_tests']}. **{t['passed_of_those']} of the {t['passed_under_lightning']} "
         "tests that pass under Lightning on this machine pass under torchfleet.** " if "passed_of_those" in t
         else f"Lightning tests: {result['lightning_tests']}. ")
        + f"All: {t['total']} selected, {t['skipped']} skipped here, passed {t['passed']}, failed {t['failed']}, "
        f"error {t['error']}, xfailed {t['xfailed']}, xpassed {t['xpassed']}.",
        "",
        "| file | passed | failed | error | skipped |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for rel, c in result["files"].items():
        lines.append(f"| {rel} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} |")
    lines += ["", "## Failures by first line (largest first)", "", "| count | first line | files |",
              "| ---: | --- | --- |"]
    for group in result["groups"][:60]:
        files = ", ".join(f"{Path(f).stem} {n}" for f, n in sorted(group["files"].items(), key=lambda kv: -kv[1]))
        message = group["message"].replace("|", "\\|")
        lines.append(f"| {group['count']} | `{message}` | {files} |")
    if len(result["groups"]) > 60:
        lines.append(f"| … | {len(result['groups']) - 60} more groups in tally.json | |")
    (out / "tally.md").write_text("\n".join(lines) + "\n")
