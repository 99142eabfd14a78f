"""A user's script: train the fsdp tests' small transformer on 2 ranks, resuming from ``ckpt_path``, nothing caught.

``python resume_from.py '{"strategy": "fsdp", "ckpt": PATH}'``: what a user sees when the checkpoint
cannot be loaded is exactly what this prints.
"""

from __future__ import annotations

import json
import sys

try:
    from tests.distributed.scripts.fsdp_train import build
except ImportError:  # run as a script from its folder
    from fsdp_train import build  # type: ignore[no-redef]

if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    model, trainer, train, val = build(cfg["strategy"], cfg.get("devices", 2))
    trainer.fit(model, train, val, ckpt_path=cfg["ckpt"])
