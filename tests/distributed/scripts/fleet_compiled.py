"""torch.compile'd models under ddp or fsdp (2 ranks): Fleet and Trainer train, save and load them under their own names.

Usage: python fleet_compiled.py STRATEGY OUT_DIR

Compiled with a counting backend that runs the captured graph as it is (``eager``'s behaviour):
the test needs dynamo's capture on the training path, not inductor's code generation (minutes on
this CPU). Rank 0 writes OUT_DIR/result.pt.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.distributed.scripts.ddp_train import make_data
from tests.distributed.scripts.fleet_train import EPOCHS, fit, plain_net
from tests.distributed.trainer_order import InOrder

GRAPHS: list[int] = []


def counting_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
    GRAPHS.append(len(gm.graph.nodes))
    return gm.forward


class Plain(nn.Module):
    """plain_net() behind a forward of our own: dynamo captures frames of user code, not torch.nn's alone."""

    def __init__(self) -> None:
        super().__init__()
        self.net = plain_net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def full(state: dict) -> dict:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in state.items()}


def saved_model_keys(path: str, entry: str) -> list[str]:
    from torchfleet.checkpoint.consolidate import read_full_dcp_checkpoint

    ckpt = read_full_dcp_checkpoint(path) if os.path.isdir(path) else torch.load(path, weights_only=False)
    return sorted(ckpt[entry])


def main(strategy: str, out_dir: str) -> None:
    import torchfleet as tf

    torch.set_num_threads(1)
    fleet = tf.Fleet(strategy=strategy, accelerator="cpu", devices=2)
    fleet.launch()
    result: dict = {}

    # Fleet: a compiled plain module
    model, opt = fit(fleet, torch.compile(Plain(), backend=counting_backend))
    result["fleet_graphs"] = len(GRAPHS)
    result["fleet_weights"] = full(model.state_dict())
    path = os.path.join(out_dir, "fleet.ckpt")
    fleet.save(path, {"model": model, "optimizer": opt})
    result["fleet_saved_keys"] = saved_model_keys(path, "model")

    # loading into a fresh compiled model (untrained weights): our checkpoint, and one whose names carry `_orig_mod.`
    old = os.path.join(out_dir, "orig_mod.pt")
    if fleet.is_global_zero:
        torch.save({"model": {f"_orig_mod.{k}": v for k, v in result["fleet_weights"].items()}}, old)
    fleet.barrier()
    for name, source in (("loaded", path), ("loaded_old", old)):
        fresh = fleet.setup(torch.compile(Plain(), backend=counting_backend))
        fleet.load(source, {"model": fresh}, strict=False)
        result[name] = full(fresh.state_dict())

    # Trainer: a compiled torchfleet Module
    class Net(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = plain_net()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    before = len(GRAPHS)
    module = Net()
    trainer = tf.Trainer(strategy=strategy, accelerator="cpu", devices=2, max_epochs=EPOCHS, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=out_dir)
    # a sampler of the program's own: the Trainer deals it out in order, as the one-process reference reads
    data = make_data()
    trainer.fit(torch.compile(module, backend=counting_backend), DataLoader(data, batch_size=8, sampler=InOrder(data)))
    result["trainer_graphs"] = len(GRAPHS) - before
    result["trainer_weights"] = full(module.state_dict())
    result["trainer_saved_keys"] = saved_model_keys(trainer.checkpoint_callback.best_model_path, "state_dict")
    fleet.barrier()
    if fleet.is_global_zero:
        torch.save(result, os.path.join(out_dir, "result.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
