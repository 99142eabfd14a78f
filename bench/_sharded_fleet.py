"""The torchfleet side of bench/sharded.py and bench/memory.py: the training of _sharded_raw.py through a Trainer.

    OMP_NUM_THREADS=1 python bench/_sharded_fleet.py fsdp --width 256 --blocks 8 --seq 64 --batch 4 \
        --steps 60 --warmup 10 --out fsdp.json       # or ddp, fsdp_cpu_offload, deepspeed_stage_2, ...
    python bench/_sharded_fleet.py --check fsdp,deepspeed_stage_3   # which variants can run here (JSON)

Run with plain ``python``: the strategy re-runs this script for rank 1. ``Trainer(strategy=...)`` gets
the registered strategy of that name; for ``fsdp*`` with ``auto_wrap_policy={Block}`` (every block its
own FSDP unit, as in the raw loop). The Trainer runs as a user configures it for speed: no logger,
checkpointing, progress bar, model summary or sanity validation, ``self.log`` of the loss every step.
Results as in _sharded_common.py; the JSON also holds the strategy's DeepSpeed config (``config``).
"""

from __future__ import annotations

import json
import sys
import time

import torch
from _sharded_common import (
    Block,
    MemoryRun,
    ShardedClock,
    dataset,
    extensions_dir,
    loss_fn,
    make_model,
    mark_rss_before_model,
    param_checksum,
    param_count,
    parse_args,
    since_launch,
)

import torchfleet
from torchfleet.callbacks import Callback

torch.set_num_threads(1)
_IMPORTED = time.time()
VARIANTS = ["ddp", "fsdp", "fsdp_cpu_offload", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3",
            "deepspeed_stage_2_offload", "deepspeed_stage_3_offload"]


def strategy(name: str):
    """The registered strategy ``name``; FSDP variants shard every Block as its own unit."""
    from torchfleet.strategies.registry import StrategyRegistry

    if name.startswith("fsdp"):
        return StrategyRegistry.get(name, auto_wrap_policy={Block})
    return StrategyRegistry.get(name)


def check(names: list[str]) -> dict[str, str]:
    """For each variant: "" when its strategy builds here, else why not (one line)."""
    out = {}
    for name in names:
        try:
            strategy(name)
            out[name] = ""
        except Exception as exc:  # noqa: BLE001 - any failure means: skip this variant, saying why
            out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return out


class Net(torchfleet.Module):
    def __init__(self, args, clock: ShardedClock) -> None:
        super().__init__()
        self.net = make_model(args.width, args.blocks)
        self.clock = clock
        self.lr = args.lr

    def training_step(self, batch, batch_idx):
        self.clock.step_start()
        x, y = batch
        loss = loss_fn(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class BenchCallback(Callback):
    """Rank 0's marks, the steady-state clock, the memory protocol (``--memory``) and the result files."""

    def __init__(self, clock: ShardedClock) -> None:
        self.clock = clock
        self.mem: MemoryRun | None = None

    def setup(self, trainer, module, stage):  # in every rank, once its process group is up
        torch.set_num_threads(1)
        if trainer.is_global_zero:
            self.clock.mark("process_group")
        self.clock.start_profiler(trainer.global_rank)

    def on_fit_start(self, trainer, module):
        if trainer.is_global_zero:
            self.clock.mark("engine_ready")
        args = self.clock.args
        if args.memory:
            self.mem = MemoryRun(args, module.net, trainer.global_rank,
                                 {"params": param_count(args.width, args.blocks), "world_size": trainer.world_size})

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.mem:
            self.mem.step_start()

    def on_after_backward(self, trainer, module):
        if self.mem:
            self.mem.after_backward()

    def on_before_zero_grad(self, trainer, module, optimizer):
        if self.mem:
            self.mem.after_step()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.mem:
            self.mem.step_end()
        self.clock.step_end()

    def on_fit_end(self, trainer, module):
        checksum = param_checksum(module.net)
        loss = trainer.callback_metrics.get("loss")
        config = getattr(trainer.strategy, "config", None)
        extra = {"config": config if isinstance(config, dict) else {}, "strategy": repr(trainer.strategy)}
        if self.mem:
            self.mem.finish({"checksum": checksum, **extra})
        self.clock.finish_sharded(trainer.global_rank, checksum, float("nan") if loss is None else float(loss), extra)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        print(json.dumps(check(sys.argv[2].split(","))))
        return
    args = parse_args(VARIANTS)
    if args.variant.startswith("deepspeed"):
        extensions_dir()
    import os

    # "imported" is when the launching script finished its imports; the ranks it starts inherit it
    os.environ.setdefault("BENCH_IMPORTED", repr(_IMPORTED))
    clock = ShardedClock(args)
    clock.marks["imported"] = since_launch(float(os.environ["BENCH_IMPORTED"]))
    mark_rss_before_model()
    torch.manual_seed(0)
    model = Net(args, clock)
    data = dataset(args, 2)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True)
    trainer = torchfleet.Trainer(
        accelerator="cpu", devices=2, strategy=strategy(args.variant), max_steps=args.steps, precision=args.precision,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[BenchCallback(clock)],
    )
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()
