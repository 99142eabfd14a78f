"""A Fleet loop under ddp with max_restarts=1, resuming itself from its checkpoint as
docs/fault_tolerance.md shows.

Usage: fleet_restart.py ROOT [run]. With "run" the script is started by ``torchfleet run --max-restarts 1``,
which then owns the restarts (the Fleet gets no max_restarts). Rank 1 raises at step 3 on the first start only (a marker file). The loop saves
ROOT/ckpt.pt every 2 steps; on a restart (``fleet.restart_count`` > 0) it loads it and goes on from the
saved step. Each rank writes ROOT/rank-<r>.json: the restart count, the step it started from, the steps run.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn

import torchfleet as tf

STEPS = 6


def main(root: str, under_run: bool) -> None:
    torch.manual_seed(0)
    fleet = tf.Fleet(accelerator="cpu", devices=2, strategy="ddp", max_restarts=0 if under_run else 1)
    fleet.launch()
    model = nn.Linear(4, 1)
    model, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ckpt = os.path.join(root, "ckpt.pt")
    state = {"model": model, "optimizer": opt, "step": 0}
    if fleet.restart_count > 0 and os.path.exists(ckpt):
        fleet.load(ckpt, state)
    start = state["step"]
    ran = []
    for step in range(start, STEPS):
        marker = os.path.join(root, "failed-once")
        if fleet.global_rank == 1 and step == 3 and not os.path.exists(marker):
            open(marker, "w").close()
            raise ValueError("boom in rank 1 at step 3")
        x = torch.full((2, 4), float(fleet.global_rank + step))
        opt.zero_grad()
        fleet.backward(model(x).pow(2).mean())
        opt.step()
        ran.append(step)
        if (step + 1) % 2 == 0:
            state["step"] = step + 1
            fleet.save(ckpt, state)
    with open(os.path.join(root, f"rank-{fleet.global_rank}.json"), "w") as f:
        json.dump({"restart_count": fleet.restart_count, "start": start, "ran": ran}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] == ["run"])
