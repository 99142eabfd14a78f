"""A 2-rank run that SIGKILLs one of its ranks at a chosen moment; tests/distributed/test_fault_matrix.py runs it.

``python fault_train.py '{"strategy": ..., "phase": ..., "rank": 1, "root": DIR}'``. A ModelCheckpoint saves
after every optimizer step under ``DIR/ckpt``. ``phase`` is where rank ``rank`` kills itself:
``train`` (training step 4), ``val`` (the first validation batch, after 3 steps and 3 checkpoints),
``save`` (inside the 3rd checkpoint save), ``sampler`` (building the training dataloader, after the
process group exists), ``init`` (entering ``init_process_group``), or ``none`` (run until stopped:
Ctrl-C tests; rank 0 writes ``DIR/ready`` after step 2). Just before killing itself the rank writes
``DIR/killed`` holding ``time.time()``, so the test can time the stop of the others.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf
from torchfleet.callbacks import Callback, ModelCheckpoint

CFG = json.loads(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].startswith("{") else {}


def processes_with(token: str) -> list[int]:
    """Live processes whose environment holds ``TF_FAULT_TOKEN=token`` (spawned children included).

    The test and bench/faults.py give each run a unique token; zombies (exited, not yet reaped) count as gone.
    """
    needle = f"TF_FAULT_TOKEN={token}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(f"/proc/{pid}/stat", "rb") as st:
                        if st.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                            found.append(int(pid))
        except OSError:
            continue
    return found


def die(rank: int) -> None:
    """SIGKILL this process if it is the chosen rank, noting the time first."""
    if rank != CFG["rank"]:
        return
    with open(os.path.join(CFG["root"], "killed.tmp"), "w") as f:
        f.write(repr(time.time()))
    os.replace(os.path.join(CFG["root"], "killed.tmp"), os.path.join(CFG["root"], "killed"))
    os.kill(os.getpid(), signal.SIGKILL)


if CFG.get("phase") == "init":
    # module level, so each process has it: a script re-run (ddp), a spawned child that imports this
    # file again (ddp_spawn), or a forked one
    _real_init = dist.init_process_group

    def _dying_init(*args, **kwargs):
        die(int(kwargs.get("rank", os.environ.get("RANK", -1))))
        return _real_init(*args, **kwargs)

    dist.init_process_group = _dying_init


class Net(tf.Module):
    def __init__(self, phase: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.phase = phase

    def training_step(self, batch, batch_idx):
        step = self.trainer.global_step
        if self.phase == "train" and step == 3:
            die(self.global_rank)
        if self.phase == "none" and step == 2 and self.global_rank == 0:
            open(os.path.join(CFG["root"], "ready"), "w").close()
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        if self.phase == "val":
            die(self.global_rank)
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def train_dataloader(self):
        if self.phase == "sampler":
            die(self.global_rank)
        g = torch.Generator().manual_seed(1234)
        x = torch.randn(64, 4, generator=g)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

    def val_dataloader(self):
        x = torch.ones(8, 4)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class KillInSave(Callback):
    """Kills the chosen rank while the 3rd checkpoint is being saved (its state is being gathered)."""

    def __init__(self) -> None:
        self.saves = 0

    def on_save_checkpoint(self, trainer, module, checkpoint):
        self.saves += 1
        if self.saves == 3:
            die(trainer.global_rank)


def main() -> None:
    torch.set_num_threads(1)
    tf.seed_everything(0)
    phase = CFG["phase"]
    callbacks = [ModelCheckpoint(dirpath=os.path.join(CFG["root"], "ckpt"), every_n_train_steps=1, save_top_k=-1,
                                 monitor=None)]
    if phase == "save":
        callbacks.append(KillInSave())
    trainer = tf.Trainer(
        strategy=CFG["strategy"], accelerator=CFG.get("accelerator", "cpu"), devices=2, max_epochs=1000 if phase == "none" else 1,
        val_check_interval=3 if phase == "val" else 1.0, num_sanity_val_steps=0, logger=False,
        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=1, default_root_dir=CFG["root"],
    )
    trainer.fit(Net(phase))


if __name__ == "__main__":
    main()
