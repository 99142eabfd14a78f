"""The torchfleet side of bench/ddp.py: the same training as _ddp_raw.py through ``torchfleet.Trainer``.

    OMP_NUM_THREADS=1 python bench/_ddp_fleet.py ddp --widths 32,64,10 --batch 32 --steps 2000 \
        --warmup 50 --out ddp.json          # or ddp_spawn, ddp_fork

Run with plain ``python``: the strategy starts the second process itself (``ddp`` re-runs this
script for rank 1, ``ddp_spawn``/``ddp_fork`` start two new processes). The Trainer runs as a
user would configure it for speed: no logger, checkpointing, progress bar, model summary or
sanity validation, and ``self.log`` of the loss in every step. Results as in _ddp_common.py.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from _ddp_common import Clock, dataset, mlp, parse_args, since_launch

import torchfleet
from torchfleet.callbacks import Callback

torch.set_num_threads(1)
_IMPORTED = time.time()  # a spawned child runs this line again: the launching process's value goes by env


class Net(torchfleet.Module):
    def __init__(self, widths: list[int], clock: Clock) -> None:
        super().__init__()
        self.net = mlp(widths)
        self.clock = clock

    def training_step(self, batch, batch_idx):
        self.clock.step_start()
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.clock.args.lr)


class ClockCallback(Callback):
    """Rank 0's marks (process group up, DDP ready), the steady-state clock and the result file."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def setup(self, trainer, module, stage):  # in every rank, once its process group is up
        torch.set_num_threads(1)
        if trainer.is_global_zero:
            self.clock.mark("process_group")
        self.clock.start_profiler(trainer.global_rank)
        if self.clock.timers is not None:
            install_timers(trainer.strategy, self.clock)

    def on_fit_start(self, trainer, module):
        if trainer.is_global_zero:
            self.clock.mark("ddp_ready")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.clock.step_end()

    def on_fit_end(self, trainer, module):
        loss = trainer.callback_metrics.get("loss")
        self.clock.finish(trainer.global_rank, module, float("nan") if loss is None else float(loss))


def install_timers(strategy, clock: Clock) -> None:
    """``--timers``: time the strategy's per-step pieces, through instance attributes of this rank's strategy.

    The fit loop looks these up on the strategy object, so wrapping them here times them without
    changing torchfleet. What is left of the step time is the loop itself (hooks, logging, batch fetch).
    """

    def timed(name, fn):
        def wrapper(*a, **kw):
            s = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                clock.add(name, time.perf_counter() - s)

        return wrapper

    strategy.batch_to_device = timed("strategy.batch_to_device", strategy.batch_to_device)
    strategy.backward = timed("strategy.backward (+all-reduce)", strategy.backward)
    strategy.optimizer_step = timed("strategy.optimizer_step", strategy.optimizer_step)
    step_function = strategy.step_function

    def step_function_timed(module, name):
        fn = step_function(module, name)
        return timed("training_step via DDP forward", fn) if name == "training_step" else fn

    strategy.step_function = step_function_timed


def main() -> None:
    args = parse_args(["ddp", "ddp_spawn", "ddp_fork", "ddp_nowatch"])
    # "imported" is when the launching script finished its imports; the ranks it starts inherit it
    os.environ.setdefault("BENCH_IMPORTED", repr(_IMPORTED))
    clock = Clock(args)
    clock.marks["imported"] = since_launch(float(os.environ["BENCH_IMPORTED"]))
    torch.manual_seed(0)
    model = Net(args.widths, clock)
    data = dataset(args.widths, args.batch, args.batches_per_epoch, 2)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True)
    trainer = torchfleet.Trainer(
        accelerator="cpu", devices=2, strategy=args.variant.replace("_nowatch", ""), max_steps=args.steps,
        hang_timeout=None if args.variant.endswith("_nowatch") else 300, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[ClockCallback(clock)],
    )
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()
