"""Run the ported programs under one strategy on 2 CPU processes; rank 0 saves what they ended with.

``python tests/ported/run_programs.py '{"strategy": "ddp", "programs": [...], "out": path, "root": dir}'``:
the first Trainer (or ``fleet.launch()``) starts rank 1 by re-running this script; each program then
builds its own Trainer on the same process group. Fleet programs (``"fleet:<name>"``) run in a Fleet.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

import torchfleet as tf  # noqa: E402
from tests.ported.programs import FLEET_PROGRAMS, TRAINER_PROGRAMS, summarise  # noqa: E402


def trainer_kwargs(strategy: str, devices: int, root: str) -> dict:
    return dict(strategy=strategy, devices=devices, accelerator="cpu", enable_progress_bar=False,
                enable_model_summary=False, logger=False, enable_checkpointing=False, num_sanity_val_steps=0,
                default_root_dir=root)


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    results = {}
    fleet = None
    for name in cfg["programs"]:
        if name.startswith("fleet:"):
            if fleet is None:
                from torchfleet.loggers import CSVLogger

                fleet = tf.Fleet(strategy=cfg["strategy"], devices=2, accelerator="cpu",
                                 loggers=CSVLogger(root_dir=os.path.join(cfg["root"], "fleet_logs")))
                fleet.launch()
            results[name] = FLEET_PROGRAMS[name.split(":", 1)[1]](fleet, cfg["root"])
            rank = fleet.global_rank
        else:
            out = TRAINER_PROGRAMS[name](trainer_kwargs(cfg["strategy"], 2, cfg["root"]), 2)
            rank = out["trainer"].global_rank
            results[name] = summarise(out)
    if rank == 0:
        torch.save(results, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
