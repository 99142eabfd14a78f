"""A user's program that fails in one of the ways a run must report once; tests/distributed/test_fault_reports.py.

``python report_faults.py '{"case": ..., "strategy": "fsdp" | "model_parallel", "devices": n, "tp": t, "dp": d,
"root": DIR}'`` trains model_parallel_train.py's Block (tensor parallel + FSDP2 under model_parallel, FSDP2 alone
under fsdp) and, after an optimizer step:

- ``"kill"``: rank ``cfg["rank"]`` SIGKILLs itself after step 2 (writing ``DIR/killed`` first);
- ``"fsize"``: saves ``DIR/ckpt/last.ckpt`` after step 1, then every rank lowers its file-size limit to
  ``cfg["limit"]`` bytes (SIGXFSZ ignored, so a write past it fails with EFBIG, "File too large") and saves it again
  after step 2;
- ``"full"``: as "fsize", but rank 0 fills the file system of ``DIR`` before the second save (a small tmpfs: "No
  space left on device").
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

from tests.distributed.scripts.model_parallel_train import build
from torchfleet.callbacks import Callback

CFG = json.loads(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].startswith("{") else {}


def fill(folder: str) -> None:
    """Write zeros into ``folder/filler`` until its file system is full."""
    with open(os.path.join(folder, "filler"), "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


class Fault(Callback):
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.path = os.path.join(cfg["root"], "ckpt", "last.ckpt")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        case, step = self.cfg["case"], trainer.global_step
        if case == "kill" and step == 2 and trainer.global_rank == self.cfg["rank"]:
            with open(os.path.join(self.cfg["root"], "killed"), "w") as f:
                f.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if case in ("fsize", "full") and step == 1:
            trainer.save_checkpoint(self.path)
        if case in ("fsize", "full") and step == 2:
            if case == "fsize":
                import resource

                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (self.cfg["limit"], resource.RLIM_INFINITY))
            elif trainer.global_rank == 0:
                fill(self.cfg["root"])
            trainer.save_checkpoint(self.path)


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    run = {"strategy": cfg["strategy"], "hidden": cfg.get("hidden", 16)}
    run.update({k: cfg[k] for k in ("tp", "dp") if k in cfg})
    model, trainer, train, val = build(run, cfg["devices"], [Fault(cfg)])
    trainer.fit(model, train, val)


if __name__ == "__main__":
    main(CFG)
