"""HivemindStrategy, the plugin in src/torchfleet_hivemind: registered through the ``torchfleet.strategies`` entry
points as a third-party package is; without hivemind, asking for it says how to install it; with hivemind, peers
on 127.0.0.1 (separate processes, tests/hivemind_peer.py) train together, resume and catch up."""

from __future__ import annotations

import importlib.util
import inspect
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib
import torch

import torchfleet as tf
from tests.helpers import Regressor, loader, quiet
from torchfleet.errors import ConfigurationError
from torchfleet.strategies import StrategyRegistry

ROOT = Path(__file__).resolve().parents[1]
HAVE_HIVEMIND = importlib.util.find_spec("hivemind") is not None
needs_hivemind = pytest.mark.skipif(not HAVE_HIVEMIND, reason="hivemind is not installed (pip install 'torchfleet[hivemind]')")
PEER = ROOT / "tests" / "hivemind_peer.py"
#: two peer ids as hivemind writes them (base58 multihashes of public keys)
PEER_A = "12D3KooWKdMiU7hPpMANgGSerszN4LD4kxvP2MZZjN6cJo7TdcHX"
PEER_B = "QmXfPjVj3aqdvbs2uU3aJmaGTKq6Dx3cSKNUhVK1Bi5DBf"


@pytest.fixture
def plugin_registered(tmp_path, monkeypatch):
    """The global StrategyRegistry reloading its entry points, with pyproject.toml's declaration installed (as
    ``pip install`` writes it), so the test does not depend on when torchfleet was last installed."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["torchfleet.strategies"]
    dist = tmp_path / "tf_hivemind_probe-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tf-hivemind-probe\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[torchfleet.strategies]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(StrategyRegistry, "_entry_points_loaded", False)
    had = "hivemind" in StrategyRegistry.available()
    yield declared
    if not had and "hivemind" in StrategyRegistry.available():
        StrategyRegistry.remove("hivemind")


def test_importing_torchfleet_imports_neither_hivemind_nor_the_plugin():
    code = "import sys, torchfleet, torchfleet.strategies; print(sorted(m for m in sys.modules if 'hivemind' in m))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_plugin_registers_through_the_entry_point_group(plugin_registered):
    assert plugin_registered == {"hivemind": "torchfleet_hivemind:register"}
    entry = StrategyRegistry.entry("hivemind")
    assert entry.cls.__module__ == "torchfleet_hivemind.strategy"
    assert entry.init_params == {"target_batch_size": 8192}
    assert entry.cls.requires_package == "hivemind"


@pytest.mark.skipif(HAVE_HIVEMIND, reason="checks the message shown where hivemind is not installed")
def test_asking_for_hivemind_without_the_package_says_how_to_install_it(plugin_registered):
    with pytest.raises(ConfigurationError) as raised:
        tf.Trainer(strategy="hivemind", **quiet())
    message = str(raised.value)
    assert "pip install 'torchfleet[hivemind]'" in message and "not installed" in message
    assert "\n" not in message  # one paragraph
    from torchfleet_hivemind import HivemindStrategy

    with pytest.raises(ConfigurationError, match=r"torchfleet\[hivemind\]"):
        HivemindStrategy(target_batch_size=64)


@needs_hivemind
def test_the_signature_is_lightning_hiveminds():
    from torchfleet_hivemind import HivemindStrategy

    names = list(inspect.signature(HivemindStrategy).parameters)
    assert names == ["target_batch_size", "run_id", "batch_size", "delay_state_averaging", "delay_optimizer_step",
                     "delay_grad_averaging", "offload_optimizer", "reuse_grad_buffers", "scheduler_fn",
                     "matchmaking_time", "averaging_timeout", "verbose", "averager_opts", "host_maddrs",
                     "initial_peers", "optimizer_kwargs"]
    with pytest.raises(TypeError):
        HivemindStrategy()  # target_batch_size is required, as in lightning-hivemind


@needs_hivemind
def test_construction_reads_the_peers_from_the_environment_and_starts_nothing(monkeypatch):
    from torchfleet_hivemind import HivemindStrategy

    monkeypatch.setenv("TORCHFLEET_INITIAL_PEERS", f"/ip4/10.0.0.1/tcp/1/p2p/{PEER_A}, /ip4/10.0.0.2/tcp/2/p2p/{PEER_B}")
    strategy = HivemindStrategy(target_batch_size=32, matchmaking_time=1.0, averaging_timeout=4.0, grad_compression=None)
    assert strategy.initial_peers == [f"/ip4/10.0.0.1/tcp/1/p2p/{PEER_A}", f"/ip4/10.0.0.2/tcp/2/p2p/{PEER_B}"]
    assert strategy.host_maddrs == ["/ip4/127.0.0.1/tcp/0"]  # loopback unless told otherwise
    assert strategy._dht is None and strategy.num_peers == 1  # no DHT until used
    assert strategy.optimizer_kwargs["averager_opts"]["request_timeout"] < 1.0  # below matchmaking_time
    assert strategy.optimizer_kwargs["grad_compression"] is None  # **optimizer_kwargs reach hivemind.Optimizer
    explicit = HivemindStrategy(target_batch_size=32, initial_peers=f"/ip4/10.0.0.3/tcp/3/p2p/{PEER_A}")
    assert explicit.initial_peers == [f"/ip4/10.0.0.3/tcp/3/p2p/{PEER_A}"]  # the argument wins over the environment
    with pytest.raises(ConfigurationError, match="target_batch_size"):
        HivemindStrategy(target_batch_size=0)


BAD_ARGUMENTS = [
    # (argument, value, words the paragraph must hold besides the argument's name)
    ("initial_peers", "garbage", ["'garbage' is not a multiaddr", "/ip4/ADDRESS/tcp/PORT/p2p/PEER_ID", "e.g."]),
    ("initial_peers", ["/ip4/127.0.0.1/tcp/31337"], ["no /p2p/PEER_ID part"]),
    ("initial_peers", "127.0.0.1:31337", ["not a multiaddr"]),
    ("initial_peers", 31337, ["neither a str nor a list"]),
    ("host_maddrs", ["/ip4/127.0.0.1/tcp/0/p2p/" + PEER_A], ["belongs in initial_peers"]),
    ("host_maddrs", ["/ip4/300.0.0.1/tcp/0"], ["not a multiaddr", "/ip4/127.0.0.1/tcp/0"]),
    ("host_maddrs", [], ["names no address"]),
    ("target_batch_size", 0, ["int >= 1"]),
    ("target_batch_size", "64", ["int >= 1"]),
    ("batch_size", -8, ["int >= 1 or None"]),
    ("run_id", "", ["non-empty str"]),
    ("matchmaking_time", 0, ["> 0"]),
    ("averaging_timeout", -1.0, ["> 0"]),
    ("averaging_timeout", 1e30, ["at most 86400"]),
    ("averaging_timeout", float("nan"), ["> 0"]),
    ("delay_state_averaging", "yes", ["True or False"]),
    ("offload_optimizer", 1, ["True or False or None"]),
    ("averager_opts", ["target_group_size", 2], ["a dict"]),
    ("scheduler_fn", "StepLR", ["a callable"]),
]


@needs_hivemind
@pytest.mark.parametrize(("name", "value", "words"), BAD_ARGUMENTS, ids=[f"{b[0]}={b[1]!r}" for b in BAD_ARGUMENTS])
def test_each_bad_argument_is_one_paragraph_naming_it(name, value, words, monkeypatch):
    from torchfleet_hivemind import HivemindStrategy

    monkeypatch.delenv("TORCHFLEET_INITIAL_PEERS", raising=False)
    kwargs = {"target_batch_size": 64, name: value}
    with pytest.raises(ConfigurationError) as raised:
        HivemindStrategy(**kwargs)
    message = str(raised.value)
    assert message.startswith(f"HivemindStrategy({name}={value!r}) is not valid:"), message
    assert "\n" not in message and all(w in message for w in words), message


@needs_hivemind
def test_bad_peers_in_the_environment_name_the_variable(monkeypatch, capsys):
    from torchfleet_hivemind import HivemindStrategy

    monkeypatch.setenv("TORCHFLEET_INITIAL_PEERS", f"/ip4/127.0.0.1/tcp/1/p2p/{PEER_A},localhost:31337")
    with pytest.raises(ConfigurationError) as raised:
        HivemindStrategy(target_batch_size=64)
    assert str(raised.value).startswith("The environment variable TORCHFLEET_INITIAL_PEERS='/ip4/127.0.0.1/tcp/1/")
    assert "'localhost:31337' is not a multiaddr" in str(raised.value)
    monkeypatch.setenv("TORCHFLEET_INITIAL_PEERS", " ")  # set but empty: a new collaboration, as when unset
    assert HivemindStrategy(target_batch_size=64).initial_peers is None


@needs_hivemind
def test_the_command_line_shows_bad_peers_as_one_paragraph_and_exit_code_2(plugin_registered, monkeypatch, capsys):
    from torchfleet.cli import main

    monkeypatch.setenv("TORCHFLEET_INITIAL_PEERS", "garbage")
    code = main(["fit", "--trainer.strategy=hivemind", "--trainer.accelerator=cpu", "--trainer.max_steps=1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("torchfleet fit: error: The environment variable TORCHFLEET_INITIAL_PEERS='garbage' is "
                          "not valid:"), err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_where_a_peer_listens_is_said_and_loopback_asks_no_port_mapping():
    from torchfleet_hivemind.network import dht_options, where_it_listens

    # the default: this machine only, no NAT port mapping (which opens a UDP socket on 0.0.0.0 and asks the router
    # to forward a port)
    assert dht_options(["/ip4/127.0.0.1/tcp/0"]) == {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "nat_port_map": False}
    assert dht_options(["/ip4/10.0.0.5/tcp/31337"])["nat_port_map"] is False  # one network: stays in it
    assert dht_options(["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic"])["nat_port_map"] is True
    text, warn = where_it_listens(["/ip4/127.0.0.1/tcp/0"], [f"/ip4/127.0.0.1/tcp/4000/p2p/{PEER_A}"])
    assert not warn and "listens on loopback only" in text and "other machines cannot" in text
    assert "not authenticated" in text and "host_maddrs=[...]" in text
    text, warn = where_it_listens(["/ip4/0.0.0.0/tcp/0"], [f"/ip4/192.0.2.2/tcp/4000/p2p/{PEER_A}"])
    assert warn and "every interface" in text and "NAT port mapping" in text
    assert f"announces /ip4/192.0.2.2/tcp/4000/p2p/{PEER_A}" in text and "not authenticated" in text
    assert "host_maddrs=['/ip4/127.0.0.1/tcp/0']" in text
    text, warn = where_it_listens(["/ip4/10.0.0.5/tcp/31337"], [f"/ip4/10.0.0.5/tcp/31337/p2p/{PEER_A}"])
    assert warn and "every interface" not in text and "not authenticated" in text


class _Epochs(tf.Callback):
    def __init__(self) -> None:
        self.at_start: int | None = None

    def on_train_start(self, trainer, module):
        self.at_start = trainer.strategy.hivemind_optimizer.local_epoch


class _Slow(Regressor):
    def training_step(self, batch, batch_idx):
        time.sleep(0.3)
        return super().training_step(batch, batch_idx)


def _alone(**kw):
    from torchfleet_hivemind import HivemindStrategy

    return HivemindStrategy(target_batch_size=16, run_id=f"alone{os.getpid()}{time.monotonic_ns()}",
                            matchmaking_time=0.5, averaging_timeout=2.0, host_maddrs=["/ip4/127.0.0.1/tcp/0"], **kw)


@needs_hivemind
@pytest.mark.slow
def test_a_peer_resumes_from_its_checkpoint_with_its_collaborative_epoch(tmp_path):
    torch.manual_seed(0)
    model = Regressor(scheduler="step")
    strategy = _alone()
    trainer = tf.Trainer(**quiet(strategy=strategy, max_steps=6))
    trainer.fit(model, loader(64))
    epoch = trainer.optimizers[0].local_epoch
    assert epoch == 3  # 16 samples per collaborative epoch, 8 per step, alone: one epoch every 2 steps
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    # tests.helpers' StepLR(step_size=3, gamma=0.5) with interval "step": stepped per collaborative epoch, not per
    # batch (6 batch steps would have halved it twice)
    assert scheduler.last_epoch == 3 and scheduler.get_last_lr() == [0.025]
    trainer.save_checkpoint(tmp_path / "peer.ckpt")
    assert strategy.hivemind_optimizer is None and strategy._dht is None  # teardown shut the peer down

    resumed_epochs = _Epochs()
    again = tf.Trainer(**quiet(strategy=_alone(), max_steps=18, callbacks=[resumed_epochs]))
    again.fit(_Slow(scheduler="step"), loader(64), ckpt_path=tmp_path / "peer.ckpt")
    assert resumed_epochs.at_start == 3  # the collaboration's epoch came back with the optimizer state
    # the tracker first reads the collaboration's progress after ~3 s: slow steps give it the time
    assert again.optimizers[0].local_epoch > 3
    assert again.lr_scheduler_configs[0].scheduler.last_epoch == again.optimizers[0].local_epoch


# short rounds: a round starts as soon as both peers joined it (--group 2), or fails after --averaging-timeout
TOGETHER = ("--sleep", "0.2", "--matchmaking", "2", "--averaging-timeout", "6", "--group", "2", "--refresh", "1")


_STARTED: list[subprocess.Popen] = []


def _kill(peer: subprocess.Popen) -> None:
    """SIGKILL the peer's process group: its DHT and averager processes (forked) and its p2p daemon die with it."""
    try:
        os.killpg(peer.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    peer.wait(timeout=30)


@pytest.fixture(autouse=True)
def _no_peer_outlives_its_test():
    yield
    while _STARTED:
        _kill(_STARTED.pop())


def _peer(out: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("TORCHFLEET_INITIAL_PEERS", None)  # a joining peer reads the first one's line (--join)
    with open(out.with_suffix(".log"), "w") as log:
        peer = subprocess.Popen([sys.executable, str(PEER), str(out), *args], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    _STARTED.append(peer)
    return peer


#: how far apart two peers' parameters can be after a round that averaged them: hivemind sends each peer the average
#: as a difference to its own tensor (return_deltas), so each adds it to another value (4.7e-10 apart was seen)
AVERAGED = 1e-6


def _gap(ours: list[list[float]], theirs: list[list[float]]) -> float:
    return max(abs(x - y) for p, q in zip(ours, theirs, strict=True) for x, y in zip(p, q, strict=True))


def _wait_file(path: Path, procs: list[subprocess.Popen], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            logs = "\n".join(p.args[2] + ":\n" + Path(p.args[2]).with_suffix(".log").read_text()[-3000:] for p in procs)
            raise AssertionError(f"{path.name} never appeared\n{logs}")
        time.sleep(0.2)
    return path.read_text()


def _finish(procs: list[subprocess.Popen], timeout: float = 120) -> list[dict]:
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)
    outs = []
    for p in procs:
        out = Path(p.args[2])
        assert p.returncode == 0 and out.exists(), out.with_suffix(".log").read_text()[-3000:]
        outs.append(json.loads(out.read_text()))
    return outs


@needs_hivemind
@pytest.mark.slow
def test_two_peers_train_together_and_end_with_equal_parameters(tmp_path):
    go, join = tmp_path / "go", tmp_path / "a.json.join"
    # both start at once (imports take seconds); the second joins with the line the first logs
    first = _peer(tmp_path / "a.json", "--seed", "1", "--epochs", "3", "--go", str(go), "--peers", "2", *TOGETHER)
    second = _peer(tmp_path / "b.json", "--seed", "2", "--epochs", "3", "--go", str(go), "--peers", "2", *TOGETHER,
                   "--join", str(join))
    line = _wait_file(join, [first, second])
    # the exact line the first peer logged: TORCHFLEET_INITIAL_PEERS=<its multiaddrs> python <its command>
    assigned = line.split(" ")[0]
    assert assigned.startswith("TORCHFLEET_INITIAL_PEERS=/ip4/127.0.0.1/tcp/") and "hivemind_peer.py" in line
    _wait_file(tmp_path / "b.json.ready", [first, second])
    go.write_text("")
    a, b = _finish([first, second])
    seen = f"(global_step, epoch) a: {a['transitions']} b: {b['transitions']}"
    assert a["end_epoch"] >= 3 and b["end_epoch"] >= 3, seen
    # each contributed: together they needed fewer local steps than one peer alone (3 epochs x 64/8 steps)
    assert a["global_step"] < 24 and b["global_step"] < 24, seen
    # the last round averaged the parameters of both: each holds the same average (to the last bits)
    for name in ("a", "b"):
        assert "Averaged parameters with 2 peers" in (tmp_path / f"{name}.log").read_text()
    assert _gap(a["params"], b["params"]) <= AVERAGED
    assert a["loss_after"] < a["loss_before"] / 2 and b["loss_after"] < b["loss_before"] / 2
    # neither peer was given host_maddrs: each listened on loopback only and said so, and no process of either (the
    # DHT's p2p daemon, the averagers) held a socket on another address while they averaged
    for name, peer in (("a", a), ("b", b)):
        assert "this peer listens on loopback only (/ip4/127.0.0.1/tcp/0" in (tmp_path / f"{name}.log").read_text()
        held = [tuple(s) for s in peer["sockets"]]
        assert ("p2pd", "TCP", "127.0.0.1", "LISTEN") in held, held
        assert all(ipaddress.ip_address(ip).is_loopback for _, _, ip, _ in held), held


@needs_hivemind
@pytest.mark.slow
def test_a_late_peer_catches_up_with_the_collaboration(tmp_path):
    # the first peer trains alone to epoch 2, then waits (not stepping) until it sees the late peer
    first = _peer(tmp_path / "a.json", "--seed", "1", "--epochs", "5", "--peers", "2", "--meet", "2", *TOGETHER)
    # the late peer starts from other initial parameters, once the first reached epoch 2 (its imports done before)
    late = _peer(tmp_path / "c.json", "--seed", "3", "--epochs", "5", "--wait-for", f"{tmp_path / 'a.json.progress'}:2",
                 "--peers", "2", "--init-seed", "7", *TOGETHER, "--join", str(tmp_path / "a.json.join"))
    a, c = _finish([first, late])
    seen = f"(global_step, epoch) a: {a['transitions']} c: {c['transitions']}"
    # load_state_from_peers brought the first peer's epoch and the parameters it held in that epoch, bitwise
    assert c["start_epoch"] >= 2, seen
    assert c["init_params"] != a["init_params"]
    assert c["start_params"] == a["epoch_params"][str(c["start_epoch"])]
    assert a["end_epoch"] >= 5 and c["end_epoch"] >= 5, seen
    # the late peer reached epoch 5 in fewer local steps than 3 epochs alone (3 x 64/8)
    assert c["global_step"] < 24, seen
    for name in ("a", "c"):
        assert "Averaged parameters with 2 peers" in (tmp_path / f"{name}.log").read_text()
    assert _gap(a["params"], c["params"]) <= AVERAGED


def _wait_epoch(progress: Path, epoch: int, procs: list[subprocess.Popen], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not (progress.exists() and int(progress.read_text()) >= epoch):
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, f"{progress.name} < {epoch}"
        time.sleep(0.05)


@needs_hivemind
@pytest.mark.slow
def test_a_killed_peer_does_not_stop_the_other(tmp_path):
    go = tmp_path / "go"
    first = _peer(tmp_path / "a.json", "--seed", "1", "--epochs", "2", "--go", str(go), "--peers", "2", *TOGETHER)
    # the second stops stepping at its first collaborative epoch (so it takes part in no later round), to be killed
    second = _peer(tmp_path / "b.json", "--seed", "2", "--epochs", "1000", "--go", str(go), "--peers", "2", *TOGETHER,
                   "--join", str(tmp_path / "a.json.join"), "--freeze", "1")
    _wait_file(tmp_path / "b.json.ready", [first, second])
    go.write_text("")
    try:
        _wait_epoch(tmp_path / "b.json.progress", 1, [first, second])
    finally:
        _kill(second)  # SIGKILL, with its helper processes: no goodbye, its records stay in the DHT
    killed = time.monotonic()
    (a,) = _finish([first], timeout=90)
    after = time.monotonic() - killed
    log = (tmp_path / "a.log").read_text()
    print(f"first peer finished {after:.1f} s after the kill; transitions {a['transitions']}")
    assert a["end_epoch"] >= 2, a["transitions"]
    before, _, since = log.partition("Transitioning to epoch 1")
    assert "Averaged parameters with 2 peers" in before  # they did train together before the kill
    # the round after the kill found no group: the first peer went on with its own gradients after averaging_timeout
    assert "Proceeding with local gradients" in since and "Averaged parameters with 2 peers" not in since
    # two rounds (gradients, then state) that wait out averaging_timeout (6 s each), then the shutdown
    assert after < 45


@needs_hivemind
@pytest.mark.slow
def test_a_peer_restarted_from_its_checkpoint_rejoins(tmp_path):
    ckpt, join, go = tmp_path / "b.ckpt", str(tmp_path / "a.json.join"), tmp_path / "go"
    # the first peer trains with the second to epoch 2, goes on alone, and at epoch 3 waits (not stepping) until the
    # restarted peer has stepped and it sees it
    first = _peer(tmp_path / "a.json", "--seed", "1", "--epochs", "5", "--go", str(go), "--peers", "2",
                  "--meet", "0", "--meet", f"3:{tmp_path / 'r.json.progress'}", *TOGETHER)
    # the second stops at epoch 2 and saves its checkpoint
    second = _peer(tmp_path / "b.json", "--seed", "2", "--epochs", "2", "--go", str(go), "--peers", "2",
                   "--checkpoint", str(ckpt), *TOGETHER, "--join", join)
    # the same peer restarted (its imports done meanwhile) from the checkpoint, once the second exited and the first
    # went on to epoch 3 without it
    restarted = _peer(tmp_path / "r.json", "--seed", "2", "--epochs", "5", "--peers", "2", "--resume", str(ckpt),
                      "--wait-for", str(tmp_path / "b.json"), "--wait-for", f"{tmp_path / 'a.json.progress'}:3",
                      *TOGETHER, "--join", join)
    _wait_file(tmp_path / "b.json.ready", [first, second, restarted])
    go.write_text("")
    (b,) = _finish([second])
    # the checkpoint holds the collaboration's epoch with the optimizer state
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert saved["optimizer_states"][0]["state"]["local_epoch"] == b["end_epoch"] == 2
    a, r = _finish([first, restarted])
    seen = f"(global_step, epoch) a: {a['transitions']} b: {b['transitions']} restarted: {r['transitions']}"
    assert r["resumed_epoch"] == 2, seen  # the checkpoint's epoch, before loading the peers' state
    assert r["global_step"] > b["global_step"], seen  # the Trainer resumed too
    # it caught up with the first peer, which went on while it was away, and continued the count to epoch 5
    assert r["start_epoch"] >= 3 and r["start_params"] == a["epoch_params"][str(r["start_epoch"])], seen
    assert a["end_epoch"] >= 5 and r["end_epoch"] >= 5, seen
    assert "Averaged parameters with 2 peers" in (tmp_path / "r.log").read_text()
    assert _gap(a["params"], r["params"]) <= AVERAGED
