"""One of two runs started at the same moment with one default_root_dir (tests/distributed/test_concurrent_runs.py).

``cfg``: ``root`` (the shared default_root_dir), ``port`` (the test's TCPStore, the start line both runs wait
at), ``strategy``, ``devices``, ``lr`` (this run's own hyperparameter, so its files can be told apart), ``seed``
and ``out``. The run fits one epoch with the default logger and ModelCheckpoint, then a new Trainer of the same
process fits a second epoch with ``ckpt_path="last"``. Global rank 0 writes ``out``: the first fit's log folder
and checkpoint, and the file the second fit resumed from with the weights it held right after restoring.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch

cfg = json.loads(sys.argv[1])
if "LOCAL_RANK" not in os.environ:  # the run's first process: wait until the other run has started too
    store = torch.distributed.TCPStore("127.0.0.1", cfg["port"], is_master=False, timeout=timedelta(seconds=60))
    if store.add("arrived", 1) == 2:
        store.set("go", "1")
    store.wait(["go"])

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
import torchfleet as tf  # noqa: E402
from tests.helpers import RegressionData, Regressor  # noqa: E402
from torchfleet.callbacks import Callback  # noqa: E402


class WeightsAtStart(Callback):
    """The module's weights when training starts: after a resume, those of the checkpoint it restored."""

    def on_train_start(self, trainer, module):
        self.weights = {k: v.detach().clone() for k, v in module.state_dict().items()}


def trainer(max_epochs, *callbacks):
    return tf.Trainer(accelerator="cpu", strategy=cfg["strategy"], devices=cfg["devices"], max_epochs=max_epochs,
                      default_root_dir=cfg["root"], enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, log_every_n_steps=1, callbacks=list(callbacks))


tf.seed_everything(cfg["seed"])
first = trainer(1)
first.fit(Regressor(lr=cfg["lr"]), datamodule=RegressionData())
start = WeightsAtStart()
second = trainer(2, start)
second.fit(Regressor(lr=cfg["lr"]), datamodule=RegressionData(), ckpt_path="last")
if second.is_global_zero:
    torch.save(start.weights, cfg["out"] + ".pt")
    with open(cfg["out"], "w") as f:
        json.dump({"log_dir": first.log_dir, "saved": first.checkpoint_callback.best_model_path,
                   "resumed_from": second.ckpt_path, "second_log_dir": second.log_dir}, f)
