"""The Lightning docs' custom strategy (seeds 000/001, "Create a Custom Strategy"), imports rewritten to torchfleet.

Run as ``python custom_ddp_train.py '{"out": ...}'``: strategy ddp re-runs this script for rank 1, so the
DDP subclass lives here. Rank 0 writes the weights and, per rank, how often the custom DDP was built
and ran its forward (training_step runs inside it). Deviations from the docs' text, each forced:
``device_ids=...`` is a placeholder (``determine_ddp_device_ids()`` is Lightning's helper for it);
``MyAccelerator``/``MyPrecisionPlugin`` are placeholders (the CPU accelerator and full precision here);
the docs' ``setup(self, trainer)`` override is left out: torchfleet's ``Strategy.setup(module, optimizers)``
is another method, and its body (``self.accelerator.setup()`` with no trainer, ``connect(...)``) does not
run under Lightning either (``self.precision_plugin`` itself exists: the strategy's precision).
"""

from __future__ import annotations

import json
import sys

import torch
from torch.nn.parallel import DistributedDataParallel

import torchfleet as tf
from tests.distributed.scripts.ddp_train import build
from torchfleet.accelerators import CPUAccelerator as MyAccelerator
from torchfleet.precision import Precision as MyPrecisionPlugin
from torchfleet.strategies import DDPStrategy


class MyCustomDistributedDataParallel(DistributedDataParallel):
    """Counts the wrappers built and the forward passes run in this process."""

    built = 0
    forwards = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        MyCustomDistributedDataParallel.built += 1

    def forward(self, *args, **kwargs):
        MyCustomDistributedDataParallel.forwards += 1
        return super().forward(*args, **kwargs)


# --- the docs' example ---
class CustomDDPStrategy(DDPStrategy):
    def configure_ddp(self):
        self.model = MyCustomDistributedDataParallel(
            self.model,
            device_ids=self.determine_ddp_device_ids(),
        )


accelerator = MyAccelerator()
precision_plugin = MyPrecisionPlugin()
strategy = CustomDDPStrategy(accelerator=accelerator, precision_plugin=precision_plugin)
# --- end of the docs' example ---


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    tf.seed_everything(0)
    model, trainer, train, val = build({"devices": 2, "batch": 8, **cfg}, strategy=strategy)
    trainer.fit(model, train, val)
    used = torch.tensor([[trainer.global_rank, MyCustomDistributedDataParallel.built,
                          MyCustomDistributedDataParallel.forwards,
                          int(isinstance(trainer.strategy.model, MyCustomDistributedDataParallel))]])
    per_rank = trainer.strategy.all_gather(used)
    if trainer.is_global_zero:
        torch.save({
            "weights": {k: v.clone() for k, v in model.state_dict().items()},
            "global_step": trainer.global_step,
            "per_rank": per_rank.reshape(-1, 4).tolist(),
            "precision_is_plugin": trainer.strategy.precision is precision_plugin,
        }, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
