"""A Fleet loop (strategy="ddp", 2 processes) that checks ``fleet.preemption_requested`` after each step, as
docs/fault_tolerance.md shows; rank SIGNAL_RANK sends itself SIGTERM at step 3. Each rank writes the step it stopped after.

Usage: python fleet_preempt.py SIGNAL_RANK FOLDER
"""

from __future__ import annotations

import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

import torchfleet as tf
from tests.distributed.scripts.ddp_train import make_data


def main(signal_rank: int, folder: str) -> None:
    torch.set_num_threads(1)
    fleet = tf.Fleet(strategy="ddp", accelerator="cpu", devices=2)
    fleet.launch()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    model, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))
    loader = fleet.setup_dataloaders(DataLoader(make_data(), batch_size=2))
    step = 0
    for x, y in loader:
        opt.zero_grad()
        fleet.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        step += 1
        if fleet.global_rank == signal_rank and step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        if fleet.preemption_requested:
            with open(os.path.join(folder, f"rank-{fleet.global_rank}.txt"), "w") as f:
                f.write(str(step))
            path = os.path.join(folder, "preempted.ckpt")
            fleet.save(path, {"model": model, "optimizer": opt, "step": step})
            raise tf.Preempted(f"saved {path} at step {step}", checkpoint=path)
    sys.exit("the loop ended without a preemption")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
