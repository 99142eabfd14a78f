"""Collectives over a device mesh dimension on 4 ranks (TP2 x DP2 under ModelParallelStrategy, a Fleet).

Driven by a JSON argument: ``out`` (a folder) and ``hang_timeout`` (seconds). Each rank writes ``out/rank-<r>.json``:
what its group collectives returned and the errors it got (a group it is not in; a reduce op given where the group
goes). Then the tensor-parallel groups run different numbers of their own collectives (legitimate), and rank 3 skips
one collective over "tensor_parallel": the watchdog stops the run, and the launching process reports it on stderr.
Markers in comments name the lines the test looks for.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import torchfleet as tf

CFG: dict = json.loads(sys.argv[1]) if __name__ == "__main__" else {}


def _error(call) -> str:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test reads the type and the message
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def main() -> None:
    from torch.distributed.device_mesh import DeviceMesh

    from torchfleet.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy(lambda module, mesh: module, data_parallel_size=2, tensor_parallel_size=2)
    fleet = tf.Fleet(accelerator="cpu", devices=4, strategy=strategy, hang_timeout=CFG["hang_timeout"])
    fleet.launch()
    rank = fleet.global_rank
    mesh = fleet.strategy.device_mesh
    me = torch.tensor([float(rank + 1)])
    out = {
        "tp_sum": fleet.all_reduce(me, group="tensor_parallel", reduce_op="sum").tolist(),
        "tp_gather": fleet.all_gather(me, group=mesh["tensor_parallel"]).flatten().tolist(),
        "dp_mean": fleet.all_reduce({"v": me}, mesh["data_parallel"].get_group())["v"].tolist(),
        "world_sum": fleet.all_reduce(me, reduce_op="sum").tolist(),
    }
    # a mesh of ranks 0 and 1 that every rank builds: ranks 2 and 3 are not in it
    pair = DeviceMesh("cpu", [0, 1], mesh_dim_names=("pair",))
    if rank < 2:
        out["pair_sum"] = fleet.all_reduce(me, group=pair, reduce_op="sum").tolist()
    else:
        out["pair_error"] = _error(lambda: fleet.all_reduce(me, group=pair, reduce_op="sum"))
    out["reduce_op_as_group"] = _error(lambda: fleet.all_reduce(me, "sum"))
    with open(os.path.join(CFG["out"], f"rank-{rank}.json"), "w") as f:
        json.dump(out, f)
    fleet.barrier("results written")
    # the tensor-parallel groups run different numbers of their own collectives: no desync
    if rank < 2:
        for _ in range(3):
            fleet.all_reduce(me, group="tensor_parallel")
    for step in range(4):
        if not (rank == 3 and step == 2):
            fleet.all_reduce(me, group="tensor_parallel")  # TP-LINE
        fleet.barrier("end of step")  # STEP-LINE


if __name__ == "__main__":
    main()
