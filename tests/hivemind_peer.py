"""One hivemind peer for tests/test_hivemind.py: an ordinary one-device Trainer with HivemindStrategy.

Run as a script (``python tests/hivemind_peer.py OUT.json [options]``). It trains tests.helpers' Regressor on its
own slice of data until the collaboration reaches ``--epochs`` collaborative epochs, and writes to OUT.json what
the test checks: the join line it logged (first peer), its collaborative epoch at the start of training (after
loading the peers' state) and at the end, its parameters, the validation loss before and after, and the sockets its
processes held (psutil) each time the collaborative epoch changed.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import socket
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

    At each meeting point ``(epoch, after)`` (``meet``), once its collaborative epoch reaches ``epoch`` (after its
    first step where that is 0) and the file ``after`` exists (if given), the peer stops stepping until hivemind's
    progress tracker sees ``peers`` peers: a peer that does not see the others before its collaborative epoch ends
    averages alone, and hivemind publishes a peer's progress only once it has accumulated samples, so peers cannot
    meet before their first step. It stops once it met at every point and reached ``epochs``.
    """

    def __init__(self, epochs: int, progress: Path, peers: int, meet: list[tuple[int, Path | None]] = ((0, None),),
                 freeze: int | None = None) -> None:
        self.epochs, self.progress, self.peers, self.freeze = epochs, progress, peers, freeze
        self.meet = sorted(meet, key=lambda m: m[0])  # the meeting points not reached yet
        self.resumed_epoch: int | None = None  # at on_train_start: 0, or the epoch the checkpoint held
        self.start_epoch: int | None = None
        self.start_params: list[list[float]] | None = None  # before the first step, after loading the peers' state
        self.met: list[int] = []  # the epochs at which the peers met
        #: (global_step, collaborative epoch) each time the epoch changed during training
        self.transitions: list[tuple[int, int]] = []
        self.epoch_params: dict[int, list[list[float]]] = {}
        #: (process name, kind, local address, status) of every socket the peer's processes held at an epoch change
        self.sockets: set[tuple[str, str, str, str]] = set()

    def on_train_start(self, trainer, module):
        # before the strategy's on_train_start loads the peers' state
        self.resumed_epoch = trainer.strategy.hivemind_optimizer.local_epoch

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.start_epoch is None:  # the strategy's on_train_start (load_state_from_peers) has run
            self.start_epoch = trainer.strategy.hivemind_optimizer.local_epoch
            self.start_params = params(module)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        opt = trainer.strategy.hivemind_optimizer
        write(self.progress, str(opt.local_epoch))  # before waiting: a late peer may start on it
        if self.meet and opt.local_epoch >= self.meet[0][0]:
            after = self.meet.pop(0)[1]
            deadline = time.monotonic() + 60
            while ((after is not None and not after.exists())
                   or opt.tracker.global_progress.num_peers < self.peers) and time.monotonic() < deadline:
                # report again, unchanged: hivemind extrapolates a peer's samples from its last report at its last
                # speed, so a peer that waits would seem to have ended the epoch, and a peer that joins would end it
                # alone on its first step
                opt.tracker.report_local_progress(opt.local_epoch, opt.tracker.local_progress.samples_accumulated)
                time.sleep(0.1)
            self.met.append(opt.local_epoch)
        epoch = opt.local_epoch
        if epoch != (self.transitions[-1][1] if self.transitions else self.start_epoch):
            self.transitions.append((trainer.global_step, epoch))
            self.sockets.update(sockets())  # the averagers have run a round: every socket the peer uses is open
            self.epoch_params[epoch] = params(module)  # parameters change only when the epoch does
        if epoch >= self.epochs and not self.meet:
            trainer.should_stop = True
        while self.freeze is not None and epoch >= self.freeze:  # wait, not stepping, to be killed
            time.sleep(1)


def write(path: Path, text: str) -> None:
    """Replace ``path``'s content at once: the test and the other peers poll these files."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    part.replace(path)


def sockets() -> set[tuple[str, str, str, str]]:
    """The internet sockets of this process and its descendants (the DHT and averager processes, hivemind's p2p
    daemon): (process name, TCP/UDP, local address, status), as ``ss -tulpn`` lists them."""
    import psutil

    found = set()
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            for conn in proc.net_connections(kind="inet"):
                kind = "TCP" if conn.type == socket.SOCK_STREAM else "UDP"
                found.add((proc.name(), kind, conn.laddr.ip, conn.status))
        except psutil.NoSuchProcess:  # a helper that ended meanwhile
            pass
    return found


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
    parser.add_argument("--wait-for", action="append", default=[], metavar="FILE[:EPOCH]",
                        help="start the peer once this file exists (and holds at least EPOCH); repeatable")
    parser.add_argument("--init-seed", type=int, default=0, help="seed of the model's initial parameters")
    parser.add_argument("--meet", action="append", default=None, metavar="EPOCH[:FILE]",
                        help="at this collaborative epoch (and once FILE exists), wait for --peers; repeatable; "
                             "default: 0")
    parser.add_argument("--freeze", type=int, default=None,
                        help="at this collaborative epoch, stop stepping (the test kills the peer)")
    parser.add_argument("--resume", default=None, help="resume from this checkpoint")
    parser.add_argument("--checkpoint", default=None, help="after training, save a checkpoint here")
    parser.add_argument("--sleep", type=float, default=0.05, help="seconds each training step sleeps")
    parser.add_argument("--matchmaking", type=float, default=1.0)
    parser.add_argument("--averaging-timeout", type=float, default=5.0)
    parser.add_argument("--join", default=None,
                        help="once this file (the first peer's join line) exists, join with the peers it names")
    parser.add_argument("--group", type=int, default=None,
                        help="target_group_size of both averagers: a round starts as soon as this many peers joined it")
    parser.add_argument("--expiration", type=float, default=None,
                        help="seconds a peer's progress stays in the DHT after its last report (60 in hivemind)")
    parser.add_argument("--host-maddrs", default=None,
                        help="HivemindStrategy(host_maddrs=...), comma-separated (default: the strategy's own)")
    parser.add_argument("--refresh", type=float, default=None,
                        help="seconds between the tracker's reads of the collaboration's progress while alone (3)")
    args = parser.parse_args()
    out = Path(args.out)
    import torch._dynamo  # noqa: F401 - torch imports it when the first optimizer is built: before waiting, not after

    if args.join:
        while not Path(args.join).exists():
            time.sleep(0.1)
        # the line the first peer logged: TORCHFLEET_INITIAL_PEERS=<multiaddrs> python <command>
        name, _, value = Path(args.join).read_text().split(" ")[0].partition("=")
        os.environ[name] = value
    join = JoinLine()
    logging.getLogger("torchfleet").addHandler(join)
    logging.getLogger("torchfleet").addHandler(logging.StreamHandler(sys.stdout))  # what a user sees, in the log
    logging.getLogger("torchfleet").setLevel(logging.INFO)
    torch.manual_seed(args.init_seed)  # peers start from the same model (unless told otherwise); the data differ
    model = SlowRegressor(lr=0.05)
    model.pause = args.sleep
    train = torch.utils.data.DataLoader(samples(512, args.seed), batch_size=8, shuffle=True)
    val_x, val_y = samples(128, 99).tensors
    with torch.no_grad():
        loss_before = torch.nn.functional.mse_loss(model(val_x), val_y).item()
    init_params = params(model)
    options: dict = {}
    if args.group:
        from hivemind.optim.grad_averager import GradientAverager

        options["averager_opts"] = {"target_group_size": args.group}
        options["grad_averager_factory"] = functools.partial(
            GradientAverager, target_group_size=args.group, request_timeout=min(3.0, args.matchmaking / 2))
    tracker = {"metadata_expiration": args.expiration, "default_refresh_period": args.refresh}
    options["tracker_opts"] = {k: v for k, v in tracker.items() if v is not None}
    strategy = HivemindStrategy(target_batch_size=args.target, run_id="tf_test", matchmaking_time=args.matchmaking,
                                averaging_timeout=args.averaging_timeout, verbose=True,
                                host_maddrs=args.host_maddrs.split(",") if args.host_maddrs else None, **options)
    meet = []
    for point in args.meet or ["0"]:
        epoch, _, after = point.partition(":")
        meet.append((int(epoch), Path(after) if after else None))
    collab = Collaboration(args.epochs, out.parent / (out.name + ".progress"), args.peers, meet, args.freeze)
    trainer = tf.Trainer(**quiet(strategy=strategy, max_steps=args.max_steps, max_epochs=-1, callbacks=[collab]))
    for wait in args.wait_for:
        path, _, epoch = wait.partition(":")
        while not (Path(path).exists() and (not epoch or int(Path(path).read_text()) >= int(epoch))):
            time.sleep(0.1)
    strategy.dht  # noqa: B018 - start the peer now: the first one logs the join line
    if join.lines:
        write(out.parent / (out.name + ".join"), join.lines[0])
    write(out.parent / (out.name + ".ready"), str(os.getpid()))
    while args.go and not Path(args.go).exists():
        time.sleep(0.1)
    trainer.fit(model, train, ckpt_path=args.resume)
    if args.checkpoint:
        trainer.save_checkpoint(args.checkpoint)
    with torch.no_grad():
        loss_after = torch.nn.functional.mse_loss(model(val_x), val_y).item()
    write(out, json.dumps({
        "join": join.lines, "start_epoch": collab.start_epoch, "transitions": collab.transitions,
        "resumed_epoch": collab.resumed_epoch, "init_params": init_params, "start_params": collab.start_params,
        "epoch_params": collab.epoch_params, "met": collab.met,
        "end_epoch": trainer.optimizers[0].local_epoch, "global_step": trainer.global_step,
        "params": params(model), "sockets": sorted(collab.sockets),
        "loss_before": loss_before, "loss_after": loss_after, "pid": os.getpid(),
    }))


if __name__ == "__main__":
    main()
