"""Run the ported programs under one strategy on one or 2 CPU processes; rank 0 saves what they ended with.

``python tests/ported/run_programs.py '{"strategy": "ddp", "programs": [...], "out": path, "root": dir}'``
(``"devices": 1`` with ``"strategy": "auto"`` for one process; 2 by default; ``"strategies"``: a program's own
strategy, by name, where it needs another): under a parallel strategy the
first Trainer (or ``fabric.launch()``) starts rank 1 by re-running this script; each program then builds its
own Trainer on the same process group. Fabric programs (``"fleet:<name>"``) share one Fabric.

The same script runs under Lightning once tests/ported/lightning_imports.py has turned its imports (and the
programs') back to Lightning's.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from tests.ported import programs, programs_extra  # noqa: E402
from torchfleet import Fleet as Fabric  # noqa: E402
from torchfleet.loggers import CSVLogger  # noqa: E402

TRAINER_PROGRAMS = {**programs.TRAINER_PROGRAMS, **programs_extra.TRAINER_PROGRAMS}
FLEET_PROGRAMS = {**programs.FLEET_PROGRAMS, **programs_extra.FLEET_PROGRAMS}


def trainer_kwargs(strategy: str, devices: int, root: str) -> dict:
    return dict(strategy=strategy, devices=devices, accelerator="cpu", enable_progress_bar=False,
                enable_model_summary=False, logger=False, enable_checkpointing=False, num_sanity_val_steps=0,
                default_root_dir=root)


def run(cfg: dict) -> dict:
    """Every program of ``cfg["programs"]`` in this process (and its ranks); what each ended with, by name."""
    torch.set_num_threads(1)
    devices = cfg.get("devices", 2)
    results = {}
    fabric = None
    for name in cfg["programs"]:
        if name.startswith("fleet:"):
            if fabric is None:
                fabric = Fabric(strategy=cfg["strategy"], devices=devices, accelerator="cpu",
                                loggers=CSVLogger(root_dir=os.path.join(cfg["root"], "fleet_logs")))
                fabric.launch()
            results[name] = FLEET_PROGRAMS[name.split(":", 1)[1]](fabric, cfg["root"])
            results["rank"] = fabric.global_rank
        else:
            strategy = cfg.get("strategies", {}).get(name, cfg["strategy"])
            out = TRAINER_PROGRAMS[name](trainer_kwargs(strategy, devices, cfg["root"]), devices)
            results["rank"] = out["trainer"].global_rank
            results[name] = programs.summarise(out)
    return results


def main(cfg: dict) -> None:
    results = run(cfg)
    if results.pop("rank") == 0:
        torch.save(results, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
