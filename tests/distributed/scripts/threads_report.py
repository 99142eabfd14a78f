"""Each rank writes the intra-op thread count torch uses during fit to ``<out>/rank-<r>.json``.

Argument (JSON): out (a folder), strategy ("ddp" | "ddp_spawn" | "single_device"), devices, affinity (a list of
CPU indices this process is restricted to before torch starts, or null), set_threads (call
torch.set_num_threads with it before the Trainer, or null).
"""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":
    _cfg = json.loads(sys.argv[1])
    if _cfg.get("affinity") is not None:
        os.sched_setaffinity(0, _cfg["affinity"])

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import torchfleet as tf  # noqa: E402


class Reporter(tf.Module):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def on_train_start(self) -> None:
        with open(os.path.join(self.out, f"rank-{self.global_rank}.json"), "w") as f:
            json.dump({"threads": torch.get_num_threads(), "usable": len(os.sched_getaffinity(0))}, f)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(cfg: dict) -> None:
    if cfg.get("set_threads") is not None:
        torch.set_num_threads(cfg["set_threads"])
    trainer = tf.Trainer(accelerator="cpu", strategy=cfg["strategy"], devices=cfg.get("devices", 1), max_epochs=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    trainer.fit(Reporter(cfg["out"]), data)


if __name__ == "__main__":
    main(_cfg)
