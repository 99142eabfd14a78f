"""A Fleet script whose processes were all started from outside (torchrun's variables, or ``torchfleet run``).

Usage: python fleet_started_outside.py MODE OUT_DIR
  MODE "torchrun": ``Fleet(strategy="ddp", accelerator="cpu", devices=2)``; "cli": ``Fleet()`` with no
  arguments (``torchfleet run`` passes them through the environment).

``setup`` is called without ``launch``: the processes exist already. Then ``rank_zero_first``:
rank 0 stays a while in the block and records whether rank 1 had entered; rank 1 records whether
rank 0 had left when it entered. Each rank writes OUT_DIR/rank-<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from torch import nn


def main(mode: str, out_dir: str) -> None:
    import torchfleet as tf

    torch.set_num_threads(1)
    fleet = tf.Fleet() if mode == "cli" else tf.Fleet(strategy="ddp", accelerator="cpu", devices=2)
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = fleet.setup(model, opt)  # no launch(): every process already runs
    x = torch.full((1, 2), float(fleet.global_rank + 1))
    fleet.backward(model(x).sum())
    opt.step()

    rank = fleet.global_rank
    # Lightning's has_len_all_ranks sums the ranks' loader lengths through the strategy (a collective)
    from torchfleet.errors import ConfigurationError
    from torchfleet.utilities.data import has_len_all_ranks

    uneven = has_len_all_ranks([0] * (rank + 2), fleet.strategy)  # 2 and 3 batches
    empty_here = [0, 0] if rank == 0 else []
    try:
        refused = not has_len_all_ranks(empty_here, fleet.strategy)
    except ConfigurationError as error:
        refused = str(error).split(" while ")[0]
    allowed = has_len_all_ranks(empty_here, fleet.strategy, allow_zero_length_dataloader_with_multiple_devices=True)
    marks = {n: os.path.join(out_dir, f"{n}") for n in ("enter-0", "leave-0", "enter-1")}
    record: dict = {}
    with fleet.rank_zero_first():
        open(os.path.join(out_dir, f"enter-{rank}"), "w").close()
        if rank == 0:
            time.sleep(1.5)  # rank 1 would be inside by now if it did not wait
            record["other_entered_meanwhile"] = os.path.exists(marks["enter-1"])
            open(marks["leave-0"], "w").close()
        else:
            record["rank0_had_left"] = os.path.exists(marks["leave-0"])
    record.update(
        rank=rank,
        world_size=fleet.world_size,
        strategy=type(fleet.strategy).__name__,
        device=str(fleet.device),
        precision=fleet.strategy.precision.name,
        argv=sys.argv[3:],
        # the gradients were averaged over both ranks: (1 + 2) / 2 per input dimension
        weight_grad=model.module.weight.grad.tolist(),
        len_all_ranks=[uneven, refused, allowed],
    )
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
