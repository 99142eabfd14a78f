"""The Lightning docs' custom strategy (seeds 000/001, "Create a Custom Strategy"), imports rewritten to torchfleet.

Run as ``python custom_ddp_train.py '{"out": ..., "strategy": "docs" | "closure"}'``: strategy ddp re-runs
this script for rank 1, so the subclasses live here. "docs" is the docs' ``CustomDDPStrategy`` whole:
``configure_ddp`` building its own DistributedDataParallel and ``setup(self, trainer)`` reaching the
accelerator and the precision plugin, then ``super().setup(trainer)``. "closure" is a strategy whose
``optimizer_step`` calls the closure itself and then steps the optimizer (as hivemind's and colossalai's
strategies do, and LBFGS-style code). Rank 0 writes the weights and, per rank, what each strategy saw.
Deviations from the docs' text, each forced: ``device_ids=...`` is a placeholder
(``determine_ddp_device_ids()`` is Lightning's helper for it); ``self.accelerator.setup()`` and
``self.precision_plugin.connect(...)`` name their arguments (Lightning's take the trainer, and the model,
optimizers and schedulers); ``MyAccelerator``/``MyPrecisionPlugin`` are placeholders (the CPU accelerator and
full precision here).
"""

from __future__ import annotations

import json
import sys

import torch
from torch.nn.parallel import DistributedDataParallel

import torchfleet as tf
from tests.distributed.scripts.ddp_train import build
from torchfleet.accelerators import CPUAccelerator as MyAccelerator
from torchfleet.callbacks import Callback
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


SEEN = {"setup": 0, "module_in_configure_ddp": 0, "closure_calls": 0, "optimizer_steps": 0}


# --- the docs' example ---
class CustomDDPStrategy(DDPStrategy):
    def configure_ddp(self):
        SEEN["module_in_configure_ddp"] += isinstance(self.model, tf.Module)  # Lightning's: the Module itself
        self.model = MyCustomDistributedDataParallel(
            self.model,
            device_ids=self.determine_ddp_device_ids(),
        )

    def setup(self, trainer):
        # you can access the accelerator and plugins directly
        self.accelerator.setup(trainer)
        self.precision_plugin.connect(self.model, self.optimizers, self.lr_scheduler_configs)
        SEEN["setup"] += 1
        super().setup(trainer)
# --- end of the docs' example ---


class ClosureCallingStrategy(DDPStrategy):
    """Runs the step itself: the closure (training_step and backward) first, then the optimizer, as hivemind's does."""

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        loss = closure()
        SEEN["closure_calls"] += 1
        optimizer.step()
        SEEN["optimizer_steps"] += 1
        return loss


class WrapperDuringFit(Callback):
    """What ``strategy.model`` is while training runs (teardown unwraps it when the stage ends)."""

    custom = False

    def on_train_end(self, trainer, module):
        WrapperDuringFit.custom = isinstance(trainer.strategy.model, MyCustomDistributedDataParallel)


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    tf.seed_everything(0)
    if cfg.get("strategy", "docs") == "docs":
        accelerator = MyAccelerator()
        precision_plugin = MyPrecisionPlugin()
        strategy = CustomDDPStrategy(accelerator=accelerator, precision_plugin=precision_plugin)
    else:
        strategy, precision_plugin = ClosureCallingStrategy(), None
    model, trainer, train, val = build({"devices": 2, "batch": 8, **cfg}, strategy=strategy)
    trainer.callbacks.append(WrapperDuringFit())
    trainer.fit(model, train, val)
    used = torch.tensor([[trainer.global_rank, MyCustomDistributedDataParallel.built,
                          MyCustomDistributedDataParallel.forwards, int(WrapperDuringFit.custom),
                          int(trainer.strategy.model is model), *SEEN.values()]])
    per_rank = trainer.strategy.all_gather(used)
    if trainer.is_global_zero:
        torch.save({
            "weights": {k: v.clone() for k, v in model.state_dict().items()},
            "global_step": trainer.global_step,
            "per_rank": per_rank.reshape(2, -1).tolist(),
            "columns": ["rank", "built", "forwards", "custom_during_fit", "unwrapped_after", *SEEN],
            "precision_is_plugin": trainer.strategy.precision is precision_plugin,
        }, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
