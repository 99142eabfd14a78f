"""A Trainer run in which one rank fails (raises, or SIGKILLs itself) at a step, driven by JSON; restarts resume it.

Options: strategy (ddp, ddp_spawn, ...), devices, root (default_root_dir; checkpoints go to root/checkpoints every
3 optimizer steps), out (rank 0 saves the final weights there when fit returns), fail_rank (-1: none),
fail_step, fail_how ("raise" | "kill" | "hang": sleep in training_step), hang_timeout, marker (a path: the rank fails only while it does not exist, and
creates it first, so only the first attempt fails; absent: it fails on every attempt), max_restarts.
Each start appends "start <restart count>" to root/starts-<rank>.txt.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader

import torchfleet as tf
from tests.distributed.scripts.preempt_train import Net as PreemptNet
from tests.distributed.scripts.preempt_train import regression_data
from torchfleet.preemption import restart_count


class Net(PreemptNet):
    """preempt_train's model (with dropout: a resume must restore the RNG too), failing where asked."""

    def __init__(self, cfg: dict) -> None:
        super().__init__(cfg)
        self.cfg = cfg

    def on_fit_start(self) -> None:
        with open(os.path.join(self.cfg["root"], f"starts-{self.global_rank}.txt"), "a") as f:
            f.write(f"start {restart_count()}\n")

    def training_step(self, batch, batch_idx):
        cfg = self.cfg
        if self.global_rank == cfg.get("fail_rank", -1) and self.trainer.global_step == cfg.get("fail_step", 1):
            marker = cfg.get("marker")
            if marker is None or not os.path.exists(marker):
                if marker is not None:
                    open(marker, "w").close()
                if cfg.get("fail_how", "raise") == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if cfg.get("fail_how") == "hang":  # stuck in user code: the other rank waits in a collective
                    time.sleep(120)
                raise ValueError(f"boom in rank {self.global_rank} at step {self.trainer.global_step}")
        return super().training_step(batch, batch_idx)


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    tf.seed_everything(0)
    data = regression_data()
    model = Net(cfg)
    checkpoints = tf.callbacks.ModelCheckpoint(dirpath=os.path.join(cfg["root"], "checkpoints"), every_n_train_steps=3)
    trainer = tf.Trainer(
        strategy=cfg.get("strategy", "ddp"), accelerator=cfg.get("accelerator", "cpu"), devices=cfg.get("devices", 2), max_epochs=2,
        default_root_dir=cfg["root"], logger=False, callbacks=[checkpoints], enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, max_restarts=cfg.get("max_restarts", 0),
        hang_timeout=cfg.get("hang_timeout", 300),
    )
    trainer.fit(model, DataLoader(data, batch_size=8, shuffle=True))
    if trainer.is_global_zero:
        torch.save({"weights": model.state_dict(), "global_step": trainer.global_step}, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
