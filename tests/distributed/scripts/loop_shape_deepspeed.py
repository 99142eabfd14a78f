"""Validate under deepspeed_stage_3 on 3 samples over 2 ranks, and write rank 0's metrics to ``cfg["out"]``.

Under ZeRO stage 3 every forward gathers parameters from all ranks, so a rank with a batch more than the
other would wait forever: the evaluation shards are padded to equal length instead.
"""

from __future__ import annotations

import json
import sys

import torch

import torchfleet as tf
from tests.distributed.scripts.loop_shape_model import Evaluated
from tests.helpers import loader, quiet

if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    torch.manual_seed(0)
    trainer = tf.Trainer(**quiet(strategy="deepspeed_stage_3", devices=2, hang_timeout=60))
    trainer.validate(Evaluated(), loader(3, 1), verbose=False)
    if trainer.is_global_zero:
        torch.save({k: float(v) for k, v in trainer.callback_metrics.items()}, cfg["out"])
