"""Lightning's Strategy contract recorded under torchfleet's Trainer with ddp on 2 processes (tests/strategy_hooks.py).

Run as ``python strategy_hooks_ddp.py '{"out": DIR}'``: strategy ddp re-runs this script for rank 1. Every
stage of the Lightning recording runs in turn, each with a new Trainer and a new recorder subclass of
``DDPStrategy(process_group_backend="gloo")``; each rank writes ``DIR/<stage>-rank<r>.json`` (its events).
The failing fit comes last: rank 0's failure stops rank 1 (the launcher's rule), so each rank also writes its
events when the strategy's ``teardown`` has run, the last strategy event of a failing stage.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import sys
import warnings

import torch

from tests import strategy_hooks as sh
from torchfleet.strategies import DDPStrategy

ORDER = ("fit", "validate", "test", "predict", "fit_resumed", "fit_accumulate", "fit_fails")
STAGE = {"name": ""}
OUT = {"dir": ""}


def write(rank: int) -> None:
    path = os.path.join(OUT["dir"], f"{STAGE['name']}-rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(list(sh.TOOL.RECORDER.events), f, indent=0)
    os.replace(path + ".tmp", path)


class Recording(sh.recorder_class(DDPStrategy, "ddp")):  # type: ignore[misc]
    """Writes this rank's events once teardown ran (a failing stage ends there)."""

    def teardown(self) -> None:
        super().teardown()
        write(self.global_rank)


def main(cfg: dict) -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("torchfleet").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    OUT["dir"] = cfg["out"]
    root = os.path.join(cfg["out"], "root")
    os.makedirs(root, exist_ok=True)
    for stage in cfg.get("stages", ORDER):
        STAGE["name"] = stage
        ckpt = None
        if stage == "fit_resumed":
            (ckpt,) = glob.glob(os.path.join(root, "fit", "*.ckpt"))
        strategy = Recording(process_group_backend="gloo")
        sh.run_stage("ddp", stage, root, strategy, 2, ckpt)
        write(strategy.global_rank)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
