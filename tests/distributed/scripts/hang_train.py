"""Rank-divergent programs for the hang/desync watchdog tests, driven by a JSON argument.

``case``: "skip_log" (rank 1 skips one self.log(sync_dist=True)), "extra_gather" (rank 0 calls one extra
self.all_gather), "sleep" (rank 1 sleeps in its own code while rank 0 waits in a barrier),
"fleet_reduce" (a Fleet loop where rank 1 calls one extra fleet.all_reduce), "torchrun_sleep" (as "sleep",
started by torchrun). ``hang_timeout`` in seconds; ``accelerator`` (default "cpu"); ``mark``: a path where the diverging rank
writes the time it diverged (bench/faults.py). Markers in comments name the lines the tests look for.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf

CFG: dict = json.loads(sys.argv[1]) if __name__ == "__main__" else {}


def _mark() -> None:
    """bench/faults.py times the report from here: the moment this rank diverges (cfg "mark": a path)."""
    if CFG.get("mark"):
        with open(CFG["mark"], "w") as f:
            f.write(repr(time.time()))


class Net(tf.Module):
    def __init__(self, case: str) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.case = case

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        case = self.case
        if case == "skip_log" and self.global_rank == 1 and batch_idx == 2:
            _mark()  # rank 1 skips the sync here
        else:
            self.log("train_loss", loss, sync_dist=True)  # LOG-LINE
        if case == "extra_gather" and self.global_rank == 0 and batch_idx == 2:
            self.all_gather(loss.detach())  # GATHER-LINE
        if case in ("sleep", "torchrun_sleep") and batch_idx == 2:
            if self.global_rank == 1:
                _mark()
                time.sleep(60)  # SLEEP-LINE
            else:
                self.barrier("before batch 3")  # BARRIER-LINE
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))


def trainer_run() -> None:
    trainer = tf.Trainer(accelerator=CFG.get("accelerator", "cpu"), strategy="ddp", devices=2, max_epochs=1,
                         log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False, logger=False,
                         enable_checkpointing=False, num_sanity_val_steps=0, hang_timeout=CFG["hang_timeout"])
    trainer.fit(Net(CFG["case"]), DataLoader(data(), batch_size=4))


def fleet_run() -> None:
    fleet = tf.Fleet(accelerator="cpu", strategy="ddp", devices=2, hang_timeout=CFG["hang_timeout"])
    fleet.launch()
    model = fleet.setup(nn.Linear(4, 1))
    for step in range(6):
        value = torch.tensor([float(step)])
        fleet.all_reduce(value)  # FLEET-REDUCE-LINE
        if fleet.global_rank == 1 and step == 2:
            fleet.all_reduce(value, reduce_op="max")  # FLEET-EXTRA-LINE
        fleet.barrier("end of step")  # FLEET-BARRIER-LINE
    del model


if __name__ == "__main__":
    if CFG["case"] == "fleet_reduce":
        fleet_run()
    else:
        trainer_run()
