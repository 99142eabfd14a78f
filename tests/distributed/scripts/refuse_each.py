"""Resume the fsdp tests' small transformer from each checkpoint in turn, in ranks that torchrun started.

``torchrun --nproc-per-node N refuse_each.py '{"ckpts": [PATH, ...], "out": DIR}'``: every rank tries ``fit`` from
each checkpoint and writes ``DIR/rank-<r>.json`` with, per checkpoint, the CheckpointError it raised (None if fit
ran). The processes outlive each refusal (torchrun started them, not the Trainer), so one launch tries them all.
"""

from __future__ import annotations

import json
import os
import sys

try:
    from tests.distributed.scripts.fsdp_train import build
except ImportError:  # run as a script from its folder
    from fsdp_train import build  # type: ignore[no-redef]

from torchfleet.errors import CheckpointError

if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    refused = {}
    for ckpt in cfg["ckpts"]:
        model, trainer, train, val = build("fsdp", int(os.environ["LOCAL_WORLD_SIZE"]))
        try:
            trainer.fit(model, train, val, ckpt_path=ckpt)
            refused[ckpt] = {"error": None, "global_step": trainer.global_step}
        except CheckpointError as exc:
            refused[ckpt] = {"error": str(exc), "global_step": trainer.global_step}
    with open(os.path.join(cfg["out"], f"rank-{os.environ['RANK']}.json"), "w") as f:
        json.dump(refused, f)
