"""Per-step overhead of Trainer and Fleet against a hand-written PyTorch loop, on one CPU process.

    python bench/overhead.py [--repeats 5] [--steps 3000] [--big-steps 40] [--only tiny|big]

Models: (a) tiny MLP 32-64-10, batch 32, SGD, torch.set_num_threads(1) — dominated by framework
overhead; (b) compute-bound MLP 1024-4096-4096-10, batch 256. Same data, same steps, variants
interleaved in every repeat. Timing is steady state: from the end of a warm-up (10% of the steps)
to the last step, read by the same timestamp in every variant's training step.
Prints µs/step (median over repeats) and the ratio to the raw loop.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet
from torchfleet import Fleet, Module, Trainer

SIZES = {"tiny": ([32, 64, 10], 32), "big": ([1024, 4096, 4096, 10], 256)}


def mlp(widths: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def data(widths: list[int], batch: int, steps: int) -> DataLoader:
    n_batches = min(steps, 500)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n_batches * batch, widths[0], generator=g)
    y = torch.randint(0, widths[-1], (n_batches * batch,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True)


class Clock:
    """Timestamps at the warm-up step and at the last step; every variant calls tick() once per step."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.n, self.t0, self.t1 = warmup, 0, 0.0, 0.0

    def tick(self) -> None:
        self.n += 1
        if self.n == self.warmup:
            self.t0 = time.perf_counter()
        self.t1 = time.perf_counter()

    def us_per_step(self) -> float:
        return (self.t1 - self.t0) / (self.n - self.warmup) * 1e6


class Net(Module):
    def __init__(self, widths: list[int], clock: Clock, log: bool = True) -> None:
        super().__init__()
        self.net = mlp(widths)
        self.clock, self.do_log = clock, log

    def training_step(self, batch, batch_idx):
        self.clock.tick()
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        if self.do_log:
            self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run_raw(widths, batch, steps, clock):
    torch.manual_seed(0)
    model = mlp(widths)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = data(widths, batch, steps)
    done = 0
    while done < steps:
        for x, y in loader:
            clock.tick()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break


def run_trainer(widths, batch, steps, clock, bar=False, logger=False, root=None):
    torch.manual_seed(0)
    model = Net(widths, clock)
    trainer = Trainer(max_steps=steps, enable_progress_bar=bar, enable_checkpointing=False, logger=logger,
                      enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=root)
    trainer.fit(model, data(widths, batch, steps))


def run_fleet(widths, batch, steps, clock):
    torch.manual_seed(0)
    fleet = Fleet(accelerator="cpu", devices=1)
    model = mlp(widths)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = fleet.setup(model, opt)
    loader = fleet.setup_dataloaders(data(widths, batch, steps))
    done = 0
    while done < steps:
        for x, y in loader:
            clock.tick()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            fleet.backward(loss)
            opt.step()
            done += 1
            if done == steps:
                break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--big-steps", type=int, default=40)
    parser.add_argument("--only", choices=list(SIZES))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    cores = torch.get_num_threads()
    tmp = tempfile.mkdtemp()
    variants = {
        "raw PyTorch loop": run_raw,
        "Trainer (self.log, no bar)": run_trainer,
        "Trainer (self.log, bar)": lambda w, b, s, c: run_trainer(w, b, s, c, bar=True),
        # named, not logger=True: the default logger is TensorBoard's where tensorboard is installed (as Lightning)
        "Trainer (self.log, CSV logger)": lambda w, b, s, c: run_trainer(
            w, b, s, c, logger=torchfleet.loggers.CSVLogger(tmp), root=tmp),
        "Fleet": run_fleet,
    }
    print(f"torch {torch.__version__}, torchfleet {torchfleet.__version__}")
    for size, (widths, batch) in SIZES.items():
        if args.only and size != args.only:
            continue
        # the tiny model measures framework overhead on one thread; the big one uses every core
        torch.set_num_threads(1 if size == "tiny" else cores)
        steps = args.steps if size == "tiny" else args.big_steps
        results: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, fn in variants.items():
                clock = Clock(max(2, steps // 10))
                fn(widths, batch, steps, clock)
                results[name].append(clock.us_per_step())
        base = statistics.median(results["raw PyTorch loop"])
        print(f"\n({'a' if size == 'tiny' else 'b'}) {size} MLP {'-'.join(map(str, widths))}, batch {batch}, "
              f"{steps} steps, {args.repeats} repeats, {torch.get_num_threads()} thread(s)")
        print(f"{'variant':<34} {'us/step':>10} {'x raw':>7}")
        for name, ts in results.items():
            med = statistics.median(ts)
            print(f"{name:<34} {med:>10.1f} {med / base:>7.3f}")


if __name__ == "__main__":
    main()
