"""A 2-rank Trainer or Fleet run that waits at a chosen place, for tests/distributed/test_signals.py to signal it.

``python signal_train.py '{"api": "trainer", "strategy": ..., "place": ..., "root": DIR}'``. Every rank that
reaches the wait writes ``DIR/ready-<rank>`` (holding its pid) and then waits there far longer than any test:

- ``start``: before the first training step (the Trainer's ``on_train_start``; a Fleet loop before its loop);
- ``val``: in the first validation batch, after 2 training steps (Trainer only);
- ``data``: in the training dataset's ``__getitem__`` for the 4th batch (``workers`` > 0: in a loader worker);
- ``collective``: rank 1 sleeps in its 4th training step while rank 0 goes on into the step's gradient
  all-reduce, where it waits for rank 1.

A ModelCheckpoint (Trainer) saves after every step under ``DIR/ckpt``; a Fleet loop with ``"reads": true`` reads
``fleet.preemption_requested`` every step (and saves ``DIR/preempted.pt`` when it is True).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import torchfleet as tf
from torchfleet.callbacks import ModelCheckpoint

CFG = json.loads(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].startswith("{") else {}
#: far longer than any test waits: a process still here after the signal failed to stop
WAIT_S = 120.0


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("LOCAL_RANK", 0))


def wait_here(who: int) -> None:
    """Say ``ready-<who>`` (with the rank's pid: a loader worker gives its parent's), then wait far longer than the
    test."""
    path = os.path.join(CFG["root"], f"ready-{who}")
    in_worker = torch.utils.data.get_worker_info() is not None
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getppid() if in_worker else os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(WAIT_S)


class SlowData(Dataset):
    """64 samples; in the 4th batch a rank fetches, the fetch waits (``place == "data"``)."""

    def __init__(self, who: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(64, 4, generator=g)
        self.fetched = 0
        self.who = who

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        self.fetched += 1
        if CFG["place"] == "data" and self.fetched == 13:  # 3 batches of 4 went through
            if CFG.get("workers"):  # a worker fetches ahead: wait until the rank runs its last step before this batch
                wait_for(os.path.join(CFG["root"], f"rank{self.who}-at-step-2"))
            wait_here(self.who)  # in a loader worker too: the rank it fetches for
        x = self.x[i]
        return x, x.sum(0, keepdim=True)


def wait_for(path: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def before_step(step: int) -> None:
    """``collective``: rank 0 notes step 3 and goes on into the all-reduce; rank 1 waits until then, and sleeps.

    ``data`` with workers: each rank notes its step 2, the last before the batch whose fetch waits."""
    if CFG["place"] == "data" and step == 2:
        open(os.path.join(CFG["root"], f"rank{rank()}-at-step-2"), "w").close()
    if CFG["place"] != "collective" or step != 3:
        return
    mark = os.path.join(CFG["root"], "rank0-at-step-3")
    if rank() == 0:
        open(mark, "w").close()
        return
    wait_for(mark)
    wait_here(1)


class Net(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def on_train_start(self) -> None:
        if CFG["place"] == "start":
            wait_here(self.global_rank)

    def training_step(self, batch, batch_idx):
        before_step(self.trainer.global_step)
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        if CFG["place"] == "val":
            wait_here(self.global_rank)
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def train_dataloader(self):
        return DataLoader(SlowData(self.global_rank), batch_size=4, num_workers=CFG.get("workers", 0))

    def val_dataloader(self):
        x = torch.ones(8, 4)
        return DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run_trainer() -> None:
    trainer = tf.Trainer(
        strategy=CFG["strategy"], accelerator="cpu", devices=2, max_epochs=1, val_check_interval=2,
        num_sanity_val_steps=0, limit_val_batches=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=CFG["root"],
        callbacks=[ModelCheckpoint(dirpath=os.path.join(CFG["root"], "ckpt"), every_n_train_steps=1, save_top_k=-1,
                                   monitor=None)],
    )
    trainer.fit(Net())


def fleet_loop(fleet: tf.Fleet) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    model, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.01))
    loader = fleet.setup_dataloaders(DataLoader(SlowData(fleet.global_rank), batch_size=4,
                                                num_workers=CFG.get("workers", 0)))
    if CFG["place"] == "start":
        wait_here(fleet.global_rank)
    for step, (x, y) in enumerate(loader):
        if CFG.get("reads") and fleet.preemption_requested:
            fleet.save(os.path.join(CFG["root"], "preempted.pt"), {"model": model, "step": step})
            raise tf.Preempted("stopped after an agreed step", "SIGTERM")
        before_step(step)
        fleet.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    torch.set_num_threads(1)
    if CFG["api"] == "trainer":
        run_trainer()
    else:
        tf.Fleet(accelerator="cpu", strategy=CFG["strategy"], devices=2).launch(fleet_loop)
