"""A Fleet loop (strategy="ddp", 2 processes) that checks ``fleet.preemption_requested`` after each step, as
docs/fault_tolerance.md shows; rank SIGNAL_RANK sends itself SIGTERM after the first step from step 40 at which
the ranks did not exchange their flags (not a polling step). Each rank writes, as JSON, the step it stopped after,
the signal's step, the agreed steps between exchanges then, and the steps at which it started an exchange.

Usage: python fleet_preempt.py SIGNAL_RANK FOLDER
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

import torchfleet as tf
from tests.distributed.scripts.ddp_train import make_data

MAX_STEPS = 5000


def main(signal_rank: int, folder: str) -> None:
    torch.set_num_threads(1)
    fleet = tf.Fleet(strategy="ddp", accelerator="cpu", devices=2)
    fleet.launch()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    model, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))
    loader = fleet.setup_dataloaders(DataLoader(make_data(), batch_size=2))
    requested = fleet.preemption_requested  # starts the watch: from here every optimizer.step() polls
    assert not requested
    agreement = fleet._preemption.agreement  # its count of exchanges: what this test measures
    step, signalled, every, polling = 0, None, None, []
    while step < MAX_STEPS:
        for x, y in loader:
            opt.zero_grad()
            fleet.backward(nn.functional.mse_loss(model(x), y))
            before = agreement.reductions
            opt.step()
            step += 1
            if agreement.reductions != before:
                polling.append(step)
            elif fleet.global_rank == signal_rank and step >= 40 and signalled is None:
                signalled, every = step, agreement.every
                os.kill(os.getpid(), signal.SIGTERM)
            if fleet.preemption_requested:
                with open(os.path.join(folder, f"rank-{fleet.global_rank}.json"), "w") as f:
                    json.dump({"stop": step, "signalled": signalled, "every": every, "polling": polling,
                               "reductions": agreement.reductions}, f)
                path = os.path.join(folder, "preempted.ckpt")
                fleet.save(path, {"model": model, "optimizer": opt, "step": step})
                raise tf.Preempted(f"saved {path} at step {step}", checkpoint=path)
    sys.exit("the loop ended without a preemption")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
