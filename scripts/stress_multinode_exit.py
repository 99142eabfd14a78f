"""Stress: the two-node torchrun run of tests/distributed/test_multinode.py, repeated; how many runs exit 0.

Issue 32 item 9: a run whose ranks all printed ``DONE`` must not fail at exit. Not part of the test suite (it takes
minutes); run it from the repository root, with the checkout's sources first on PYTHONPATH::

    PYTHONPATH=$PWD/src:$PWD python scripts/stress_multinode_exit.py --runs 20 [--load 2] [--hang-timeout 3]

``--hang-timeout`` lowers the Trainer's hang_timeout so that the watchdog thread asks torchrun's store more often
(every 0.15 s at 1.5: the exit-time abort it caused, before it was stopped at exit, came more often). ``--load N``
keeps N busy-looping processes running meanwhile (the loaded machine the failure was seen on). It prints one line per
run and a tally; a failed run's torchrun output goes to ``--keep`` (a folder) for reading.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from pathlib import Path


def _burn() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--load", type=int, default=0, help="busy-looping processes kept running meanwhile")
    parser.add_argument("--hang-timeout", type=float, default=None,
                        help="the Trainer's hang_timeout; its watchdog thread wakes every hang_timeout/10 s (at most "
                             "1 s) and, under torchrun, asks the rendezvous store each time")
    parser.add_argument("--keep", default="stress-multinode-failures", help="folder for failed runs' output")
    args = parser.parse_args()

    from tests.distributed import test_multinode as t

    burners = [mp.Process(target=_burn, daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    tally = {"ok": 0, "failed after DONE": 0, "failed": 0}
    try:
        for i in range(args.runs):
            tmp = Path(tempfile.mkdtemp(prefix="stress-multinode-"))
            port = t.find_free_port()
            extra = {} if args.hang_timeout is None else {"hang_timeout": args.hang_timeout}
            cmd = t._script_cmd(tmp, devices=1, num_nodes=2, batch=t.BATCH, epochs=t.EPOCHS, **extra)
            start = time.monotonic()
            results = t._run_together([
                (f"torchrun-node{k}",
                 t._torchrun_cmd("--nnodes=2", f"--node-rank={k}", "--nproc-per-node=1", "--master-addr=127.0.0.1",
                                 f"--master-port={port}", *cmd[1:]),
                 t._child_env())
                for k in range(2)
            ], tmp)
            codes = [r.returncode for r in results]
            done = sum("DONE" in r.stdout for r in results)
            kind = "ok" if all(c == 0 for c in codes) else ("failed after DONE" if done == 2 else "failed")
            tally[kind] += 1
            print(f"run {i + 1}: exit codes {codes}, DONE printed by {done} of 2, {time.monotonic() - start:.1f} s: "
                  f"{kind}", flush=True)
            if kind != "ok":
                keep = Path(args.keep) / f"run-{i + 1}"
                keep.parent.mkdir(parents=True, exist_ok=True)
                keep.write_text(t._report(results))
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        for b in burners:
            b.terminate()
    counts = ", ".join(f"{v} {k}" for k, v in tally.items())
    print(f"{args.runs} runs (load {args.load}, hang_timeout {args.hang_timeout}): {counts}")
    return 0 if tally["ok"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
