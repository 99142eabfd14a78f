"""Port a selection of Lightning's own unit tests to torchfleet, run them, and tally what passes.

    python tools/port_lightning_tests.py --source LIGHTNING [--ref 2.6.5] --out DIR [--reference-python PY]

``--source`` is a Lightning checkout (a work tree, or a git directory read at ``--ref`` with ``git archive``) or
a directory holding ``tests_pytorch``/``tests_fabric``. ``--out`` must lie outside this repository: Lightning's
tests and their output are never committed here. The script

1. copies the selected test files and the helpers they import into DIR/ported, rewriting their import lines
   (``tools/lightning_port/rewrite.py``; where each name goes is ``tools/lightning_port/names.py``) and giving
   them our own conftest.py and ``RunIf`` (``tools/lightning_port/support_*.py``) in place of Lightning's;
2. runs pytest on each selected file in its own process (a time limit per test, ``--timeout``, and per file),
   recording every outcome as it happens (``tools/lightning_port/record.py``);
3. with ``--reference-python`` (a Python with Lightning installed), runs the untouched files the same way,
   so the tally can tell torchfleet's failures from tests that fail here under Lightning itself;
4. writes DIR/tally.json (per test, per file, failures grouped by their message's first line) and DIR/tally.md.

The selection (``SELECTION``: 813 tests of Lightning 2.6.5 in 45 files; under Lightning 2.6.6 on a CPU-only
machine 739 pass and 74 skip) covers the parts torchfleet mirrors: the Trainer's flags and the accelerator
connector, loops and their progress, LightningModule/DataModule hooks and self.log, callbacks (ModelCheckpoint,
checkpoint frequency, LR monitor, timer, lambda, callback order), the strategies ddp/ddp_spawn/single_device and
their registry, the CPU accelerator and the accelerator registry, the double precision plugin, CheckpointIO
plugins, the CSV and TensorBoard loggers, seeding (Trainer's and Fabric's tests), argument parsing utilities and
the cluster environments (slurm, torchelastic, kubeflow, lsf, mpi; Fabric's tests, as Trainer and Fleet share
them here). Left out: whole files that need a GPU, TPU/XLA, MPS or HPU; the tuner, serve, deprecated_api and
graveyard folders; loggers and callbacks for services or packages we do not install (comet, neptune, litlogger,
pruning, onnx, tensorrt); files that test Lightning internals with no public counterpart (fetchers, the combined
loader, the data, signal, checkpoint, logger and callback connectors, _ResultCollection); and, to keep the
run near 600-800 tests on two CPU cores, the largest remaining files (test_trainer.py, test_dataloaders.py,
test_early_stopping.py, test_hooks.py, test_hparams.py, the progress bars, model summary and the profilers), which
remain candidates for a larger selection. Tests inside a selected file that need what this machine lacks are
skipped by ``RunIf`` and counted as skipped; the tally's headline counts, of the tests that pass under Lightning
here, those that pass under torchfleet.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

#: (path under Lightning's tests/ folder: a file or a folder of test_*.py files, what it covers)
SELECTION: list[tuple[str, str]] = [
    ("tests_pytorch/trainer/connectors/test_accelerator_connector.py", "connector: accelerator/strategy/devices"),
    ("tests_pytorch/trainer/flags", "Trainer flags (limit_*, fast_dev_run, val_check_interval, ...)"),
    ("tests_pytorch/trainer/properties", "Trainer properties (log_dir, loggers, estimated_stepping_batches)"),
    ("tests_pytorch/trainer/test_states.py", "trainer.state"),
    ("tests_pytorch/loops/test_progress.py", "loop progress counters"),
    ("tests_pytorch/loops/test_training_epoch_loop.py", "training epoch loop"),
    ("tests_pytorch/loops/test_evaluation_loop.py", "evaluation loop"),
    ("tests_pytorch/core/test_datamodules.py", "DataModule hooks"),
    ("tests_pytorch/core/test_lightning_module.py", "Module hooks and attributes"),
    ("tests_pytorch/trainer/logging_/test_train_loop_logging.py", "self.log in training"),
    ("tests_pytorch/callbacks/test_lr_monitor.py", "LearningRateMonitor"),
    ("tests_pytorch/callbacks/test_timer.py", "Timer"),
    ("tests_pytorch/callbacks/test_callbacks.py", "callback order and state"),
    ("tests_pytorch/callbacks/test_lambda_function.py", "LambdaCallback"),
    ("tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py", "checkpoint frequency"),
    ("tests_pytorch/checkpointing/test_model_checkpoint.py", "ModelCheckpoint"),
    ("tests_pytorch/strategies/test_registry.py", "strategy registry"),
    ("tests_pytorch/strategies/test_single_device.py", "single_device"),
    ("tests_pytorch/strategies/test_ddp.py", "ddp"),
    ("tests_pytorch/strategies/test_custom_strategy.py", "a user's own strategy"),
    ("tests_pytorch/accelerators/test_cpu.py", "CPU accelerator"),
    ("tests_pytorch/accelerators/test_registry.py", "accelerator registry"),
    ("tests_pytorch/plugins/precision/test_double.py", "64-true precision"),
    ("tests_pytorch/plugins/test_checkpoint_io_plugin.py", "CheckpointIO plugins"),
    ("tests_pytorch/loggers/test_csv.py", "CSVLogger"),
    ("tests_pytorch/loggers/test_tensorboard.py", "TensorBoardLogger"),
    ("tests_pytorch/utilities/test_seed.py", "seeding (Trainer)"),
    ("tests_pytorch/utilities/test_parsing.py", "argument/hparams parsing utilities"),
    ("tests_fabric/utilities/test_seed.py", "seeding (shared with Fleet)"),
    ("tests_fabric/plugins/environments/test_slurm.py", "SLURM environment"),
    ("tests_fabric/plugins/environments/test_torchelastic.py", "torchelastic environment"),
    ("tests_fabric/plugins/environments/test_kubeflow.py", "Kubeflow environment"),
    ("tests_fabric/plugins/environments/test_lsf.py", "LSF environment"),
    ("tests_fabric/plugins/environments/test_mpi.py", "MPI environment"),
]

_SUITES = ("tests_pytorch", "tests_fabric")
_TEST_IMPORT = re.compile(r"^\s*(?:from|import)\s+((?:tests_pytorch|tests_fabric)(?:\.\w+)+)", re.M)


def _fail(message: str) -> None:
    sys.exit(f"port_lightning_tests: {message}")


def locate_tests(source: Path, ref: str | None, scratch: Path) -> Path:
    """The folder that holds tests_pytorch/ (a work tree's tests/, an extracted one, or ``git archive`` of ``ref``)."""
    for candidate in (source, source / "tests"):
        if (candidate / "tests_pytorch").is_dir():
            return candidate
    if ref is None:
        _fail(f"--source {source} holds no tests_pytorch/ folder (nor tests/tests_pytorch); for a git directory "
              "give --ref, e.g. --ref 2.6.5.")
    scratch.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(source), "archive", ref, *[f"tests/{s}" for s in _SUITES]],
                             capture_output=True)
    if archive.returncode != 0:
        _fail(f"git archive {ref} in {source} failed: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive.stdout, check=True)
    return scratch / "tests"


def selected_files(tests: Path) -> list[str]:
    files = []
    for entry, _ in SELECTION:
        path = tests / entry
        if path.is_dir():
            files += sorted(str(p.relative_to(tests)) for p in path.rglob("test_*.py"))
        elif path.is_file():
            files.append(entry)
        else:
            _fail(f"the selection names {entry}, which {tests} does not have (another Lightning version?)")
    return files


def support_files(tests: Path, files: list[str]) -> list[str]:
    """What the selected files import from Lightning's test packages, transitively (helpers, other tests)."""
    wanted, todo, seen = set(), list(files), set(files)
    for suite in _SUITES:
        todo += [str(p.relative_to(tests)) for p in (tests / suite / "helpers").glob("*.py")]
        todo.append(f"{suite}/__init__.py")
    while todo:
        rel = todo.pop()
        wanted.add(rel)
        for module in _TEST_IMPORT.findall((tests / rel).read_text(encoding="utf-8")):
            parts = module.split(".")
            for cut in range(len(parts), 1, -1):
                for candidate in ("/".join(parts[:cut]) + ".py", "/".join(parts[:cut]) + "/__init__.py"):
                    if (tests / candidate).is_file() and candidate not in seen:
                        seen.add(candidate)
                        todo.append(candidate)
    return sorted(wanted - set(files) - {f"{s}/conftest.py" for s in _SUITES})


def _init_files(rels: list[str]) -> set[str]:
    inits = set()
    for rel in rels:
        parent = Path(rel).parent
        while str(parent) != ".":
            inits.add(str(parent / "__init__.py"))
            parent = parent.parent
    return inits


def write_ported(tests: Path, files: list[str], out: Path) -> dict:
    """Copy and rewrite the selection and its support files into ``out``; returns what could not be mapped."""
    from lightning_port.rewrite import rewrite_source

    tool = HERE / "lightning_port"
    missing: dict[str, int] = {}
    strings_left: set[str] = set()
    rels = files + support_files(tests, files)
    for rel in sorted(set(rels) | _init_files(rels)):
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith("helpers/runif.py"):
            shutil.copy(tool / "support_runif.py", target)
            continue
        if not (tests / rel).is_file():
            target.write_text("")
            continue
        ported = rewrite_source((tests / rel).read_text(encoding="utf-8"))
        target.write_text(ported.source, encoding="utf-8")
        for name, count in ported.missing.items():
            missing[name] = missing.get(name, 0) + count
        strings_left.update(ported.strings_left)
    for suite in _SUITES:
        shutil.copy(tool / "support_conftest.py", out / suite / "conftest.py")
    shutil.copy(tool / "names.py", out / "lightning_port_names.py")
    shutil.copy(tool / "record.py", out / "lightning_port_record.py")
    (out / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return {"missing_names": dict(sorted(missing.items(), key=lambda kv: -kv[1])),
            "strings_left": sorted(strings_left)}


def write_reference(tests: Path, files: list[str], out: Path) -> None:
    """The untouched selection, its support files and Lightning's own conftest, for a run under Lightning."""
    rels = files + support_files(tests, files) + [f"{s}/conftest.py" for s in _SUITES]
    for rel in sorted(set(rels) | _init_files(rels)):
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if (tests / rel).is_file():
            shutil.copy(tests / rel, target)
        else:
            target.write_text("")
    shutil.copy(HERE / "lightning_port" / "record.py", out / "lightning_port_record.py")
    (out / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")


def _has_timeout_plugin(python: str) -> bool:
    return subprocess.run([python, "-c", "import pytest_timeout"], capture_output=True).returncode == 0


def run_file(python: str, root: Path, rel: str, records: Path, pythonpath: list[str], timeout: int,
             file_timeout: int) -> None:
    """pytest on one file in its own process; outcomes go to records/<file>.jsonl as each test ends."""
    record = records / (rel.replace("/", "__") + ".jsonl")
    record.unlink(missing_ok=True)
    env = dict(os.environ, LIGHTNING_PORT_RECORD=str(record), PYTHONPATH=os.pathsep.join(pythonpath),
               PYTHONDONTWRITEBYTECODE="1")
    cmd = [python, "-m", "pytest", rel, "-q", "-p", "lightning_port_record", "-o", "console_output_style=classic"]
    if _has_timeout_plugin(python):
        cmd += ["--timeout", str(timeout)]
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=file_timeout)
        tail = proc.stdout[-4000:] + proc.stderr[-4000:]
    except subprocess.TimeoutExpired:
        tail = f"the file ran longer than {file_timeout} s and was stopped"
    (records / (rel.replace("/", "__") + ".log")).write_text(tail)


def run_all(python: str, root: Path, files: list[str], pythonpath: list[str], timeout: int, jobs: int,
            records: Path) -> Path:
    """Run ``files`` under ``root``; each file's outcomes replace its earlier ones in ``records``."""
    records.mkdir(parents=True, exist_ok=True)
    file_timeout = max(600, timeout * 10)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_file, python, root, rel, records, pythonpath, timeout, file_timeout) for rel in files]
        for future in concurrent.futures.as_completed(futures):
            future.result()
    return records


def _git_head(path: Path) -> str:
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return proc.stdout.strip() + ("+changes" if dirty else "") if proc.returncode == 0 else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="Lightning checkout, git directory or tests folder")
    parser.add_argument("--ref", help="with a git directory: the tag or commit to read (e.g. 2.6.5)")
    parser.add_argument("--out", type=Path, required=True, help="output folder, outside this repository")
    parser.add_argument("--torchfleet-src", type=Path, default=REPO / "src", help="the torchfleet to test")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs the ported tests")
    parser.add_argument("--reference-python", help="a Python with Lightning: also run the untouched tests with it")
    parser.add_argument("--reference-path", action="append", default=[],
                        help="extra import path for the reference run (e.g. a folder holding cloudpickle)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test (pytest-timeout)")
    parser.add_argument("--jobs", type=int, default=1, help="files run at the same time")
    parser.add_argument("--only", help="run only selected files whose path contains this text")
    parser.add_argument("--no-run", action="store_true", help="port only; run nothing")
    parser.add_argument("--tally-only", action="store_true", help="rewrite the tally from the recorded outcomes")
    parser.add_argument("--label", help="how the tally names the torchfleet tested (default: its git commit)")
    args = parser.parse_args(argv)

    out = args.out.resolve()
    if out == REPO or REPO in out.parents:
        _fail(f"--out {out} lies inside the repository {REPO}; Lightning's tests must not be written there. "
              "Give a folder elsewhere, e.g. /tmp/lightning-port.")
    src = args.torchfleet_src.resolve()
    if not (src / "torchfleet" / "__init__.py").is_file():
        _fail(f"--torchfleet-src {src} holds no torchfleet package; give the src/ folder of a torchfleet checkout.")
    sys.path.insert(0, str(src))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    tests = locate_tests(args.source.resolve(), args.ref, Path(tempfile.mkdtemp(prefix="lightning-src-")))
    files = selected_files(tests)
    ported = out / "ported"
    shutil.rmtree(ported, ignore_errors=True)
    port_report = write_ported(tests, files, ported)
    (out / "port_report.json").write_text(json.dumps(port_report, indent=1))
    if args.no_run:
        return 0
    chosen = [f for f in files if args.only is None or args.only in f]
    from lightning_port.tally import tally, write_tally

    # records live beside the ported tree, so a run with --only updates some files and keeps the others' outcomes
    reference_records = out / "reference_records"
    if args.tally_only:
        chosen = []
    if args.reference_python and chosen:
        reference = out / "reference"
        shutil.rmtree(reference, ignore_errors=True)
        write_reference(tests, files, reference)
        run_all(args.reference_python, reference, chosen, [str(reference), *args.reference_path], args.timeout,
                args.jobs, reference_records)
    records = run_all(args.python, ported, chosen, [str(ported), str(src)], args.timeout, args.jobs,
                      out / "records")
    if not reference_records.is_dir():
        reference_records = None
    result = tally(files, records, reference_records)
    result["torchfleet"] = args.label or (_git_head(REPO) if REPO in src.parents else str(src))
    result["lightning_tests"] = args.ref or str(args.source)
    write_tally(result, out)
    totals = result["totals"]
    print(f"torchfleet {result['torchfleet']}: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    print(f"wrote {out / 'tally.json'} and {out / 'tally.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
