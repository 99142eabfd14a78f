"""One hivemind peer for tests/test_hivemind.py: an ordinary one-device Trainer with HivemindStrategy.

Run as a script (``python tests/hivemind_peer.py OUT.json [options]``). It trains tests.helpers' Regressor on its
own slice of data until the collaboration reaches ``--epochs`` collaborative epochs, and writes to OUT.json what
the test checks: the join line it logged (first peer), its collaborative epoch at the start of training (after
loading the peers' state) and at the end, its parameters, and the validation loss before and after.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torchfleet as tf  # noqa: E402
from tests.helpers import Regressor, quiet  # noqa: E402
from torchfleet_hivemind import HivemindStrategy  # noqa: E402


def samples(n: int, seed: int) -> torch.utils.data.TensorDataset:
    """``n`` samples of one linear function (the same for every peer), drawn with ``seed``."""
    w = torch.randn(8, 1, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.TensorDataset(x, x @ w)


class SlowRegressor(Regressor):
    """Each step sleeps a little, so that peers on one loaded machine overlap in time."""

    pause = 0.05

    def training_step(self, batch, batch_idx):
        time.sleep(self.pause)
        return super().training_step(batch, batch_idx)


class Collaboration(tf.Callback):
    """Records the collaborative epoch, reports progress to a file and stops at the target epoch.

    Once its collaborative epoch reaches ``meet_epoch`` (after its first step where that is 0), the peer waits until
    hivemind's progress tracker sees ``peers`` peers: a peer that does not see the others before its collaborative
    epoch ends averages alone, and hivemind publishes a peer's progress only once it has accumulated samples, so
    peers cannot meet before their first step.
    """

    def __init__(self, epochs: int, progress: Path, peers: int, meet_epoch: int = 0, meet_pause: float = 0.0) -> None:
        self.epochs, self.progress, self.peers, self.meet_epoch = epochs, progress, peers, meet_epoch
        self.meet_pause = meet_pause  # seconds each step sleeps while waiting for the peers (0: stop stepping)
        self.start_epoch: int | None = None
        self.start_params: list[list[float]] | None = None  # before the first step, after loading the peers' state
        self.met: tuple[int, list[list[float]]] | None = None  # (epoch, parameters) when the peers met
        #: (global_step, collaborative epoch) each time the epoch changed during training
        self.transitions: list[tuple[int, int]] = []
        self.epoch_params: dict[int, list[list[float]]] = {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.start_epoch is None:  # the strategy's on_train_start (load_state_from_peers) has run
            self.start_epoch = trainer.strategy.hivemind_optimizer.local_epoch
            self.start_params = params(module)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        opt = trainer.strategy.hivemind_optimizer
        self.progress.write_text(str(opt.local_epoch))  # before waiting: a late peer may start on it
        if self.met is None and opt.local_epoch >= self.meet_epoch:
            if self.meet_pause:
                # keep stepping, slowly: a peer that stops stepping leaves a stale estimate of when its epoch ends in
                # the DHT, and the peer that joins would then end that epoch alone on its first step
                if opt.tracker.global_progress.num_peers < self.peers:
                    time.sleep(self.meet_pause)
                else:
                    self.met = (opt.local_epoch, params(module))
            else:
                deadline = time.monotonic() + 60
                while opt.tracker.global_progress.num_peers < self.peers and time.monotonic() < deadline:
                    time.sleep(0.1)
                self.met = (opt.local_epoch, params(module))
        epoch = opt.local_epoch
        if epoch != (self.transitions[-1][1] if self.transitions else self.start_epoch):
            self.transitions.append((trainer.global_step, epoch))
            self.epoch_params[epoch] = params(module)  # parameters change only when the epoch does
        if epoch >= self.epochs:
            trainer.should_stop = True


def params(module: torch.nn.Module) -> list[list[float]]:
    return [p.detach().flatten().tolist() for p in module.parameters()]


class JoinLine(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += [line for line in record.getMessage().splitlines() if "TORCHFLEET_INITIAL_PEERS=" in line]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--target", type=int, default=64)
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--peers", type=int, default=1, help="wait until the tracker sees this many peers")
    parser.add_argument("--go", default=None, help="after starting the peer, train once this file exists")
    parser.add_argument("--wait-for", default=None, help="start once this file holds at least --wait-epoch")
    parser.add_argument("--wait-epoch", type=int, default=0)
    parser.add_argument("--init-seed", type=int, default=0, help="seed of the model's initial parameters")
    parser.add_argument("--meet-pause", type=float, default=0.0, help="step this slowly while waiting for --peers")
    parser.add_argument("--meet-epoch", type=int, default=0, help="wait for --peers at this collaborative epoch")
    parser.add_argument("--sleep", type=float, default=0.05, help="seconds each training step sleeps")
    parser.add_argument("--matchmaking", type=float, default=1.0)
    parser.add_argument("--averaging-timeout", type=float, default=5.0)
    args = parser.parse_args()
    out = Path(args.out)
    if args.wait_for:
        while not (Path(args.wait_for).exists() and Path(args.wait_for).read_text().strip()
                   and int(Path(args.wait_for).read_text()) >= args.wait_epoch):
            time.sleep(0.1)
    join = JoinLine()
    logging.getLogger("torchfleet").addHandler(join)
    logging.getLogger("torchfleet").setLevel(logging.INFO)
    torch.manual_seed(args.init_seed)  # peers start from the same model (unless told otherwise); the data differ
    model = SlowRegressor(lr=0.05)
    model.pause = args.sleep
    train = torch.utils.data.DataLoader(samples(512, args.seed), batch_size=8, shuffle=True)
    val_x, val_y = samples(128, 99).tensors
    with torch.no_grad():
        loss_before = torch.nn.functional.mse_loss(model(val_x), val_y).item()
    init_params = params(model)
    strategy = HivemindStrategy(target_batch_size=args.target, run_id="tf_test", matchmaking_time=args.matchmaking,
                                averaging_timeout=args.averaging_timeout, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                                verbose=True)
    strategy.dht  # noqa: B018 - start the peer now: the first one logs the join line
    if join.lines:
        (out.parent / (out.name + ".join")).write_text(join.lines[0])
    (out.parent / (out.name + ".ready")).write_text(str(os.getpid()))
    while args.go and not Path(args.go).exists():
        time.sleep(0.1)
    collab = Collaboration(args.epochs, out.parent / (out.name + ".progress"), args.peers, args.meet_epoch,
                           args.meet_pause)
    trainer = tf.Trainer(**quiet(strategy=strategy, max_steps=args.max_steps, max_epochs=-1, callbacks=[collab]))
    trainer.fit(model, train)
    with torch.no_grad():
        loss_after = torch.nn.functional.mse_loss(model(val_x), val_y).item()
    out.write_text(json.dumps({
        "join": join.lines, "start_epoch": collab.start_epoch, "transitions": collab.transitions,
        "init_params": init_params, "start_params": collab.start_params,
        "epoch_params": collab.epoch_params, "met": collab.met,
        "end_epoch": trainer.optimizers[0].local_epoch, "global_step": trainer.global_step,
        "params": params(model),
        "loss_before": loss_before, "loss_after": loss_after, "pid": os.getpid(),
    }))


if __name__ == "__main__":
    main()
