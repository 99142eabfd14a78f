"""Launcher pieces that need no second process: pickling diagnosis, re-run commands, exit texts, options."""

from __future__ import annotations

import signal
import sys
import threading

import pytest
import torch
from torch import nn

from torchfleet.errors import ConfigurationError
from torchfleet.launchers.base import ProcessFailedError, describe_exit, interactive_session
from torchfleet.launchers.pickling import find_unpicklable
from torchfleet.launchers.processes import ProcessLauncher
from torchfleet.launchers.script import command_to_rerun
from torchfleet.strategies import DDPStrategy


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(2, 2))


def test_picklable_objects_report_nothing():
    assert find_unpicklable(Holder(), "model") is None
    assert find_unpicklable({"a": [1, 2, torch.ones(2)]}, "state") is None


def test_unpicklable_attribute_path_goes_through_submodules_and_containers():
    model = Holder()
    model.inner[0].hook = lambda x: x  # a lambda two modules down
    path, error = find_unpicklable(model, "model")
    assert path == "model.inner.0.hook -> <lambda>"
    assert "lambda" in str(error)
    lock_path, _ = find_unpicklable({"cfg": {"lock": threading.Lock()}}, "kwargs")
    assert lock_path == "kwargs['cfg']['lock'] -> <lock>"


def test_exit_descriptions_name_signals_and_codes():
    assert describe_exit(-signal.SIGKILL) == " (killed by SIGKILL)"
    assert describe_exit(3) == " (exit code 3)"
    assert describe_exit(None) == ""
    err = ProcessFailedError(2, "Traceback...\nValueError: x\n", -signal.SIGTERM)
    assert str(err).startswith("Rank 2 failed (killed by SIGTERM)")
    assert err.rank == 2 and "ValueError: x" in str(err)


@pytest.mark.parametrize("orig_argv, expected_tail", [
    (["python", "train.py", "--lr", "0.1"], ["train.py", "--lr", "0.1"]),
    (["python3", "-u", "-m", "pkg.train", "fit"], ["-u", "-m", "pkg.train", "fit"]),
    (["/venv/bin/python", "/venv/bin/torchfleet", "fit", "--trainer.devices=2"],
     ["/venv/bin/torchfleet", "fit", "--trainer.devices=2"]),
])
def test_the_rerun_command_is_the_original_with_this_interpreter(monkeypatch, orig_argv, expected_tail):
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    assert command_to_rerun() == [sys.executable, *expected_tail]


def test_interactive_sessions_are_recognised(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py"])
    assert not interactive_session()
    monkeypatch.setattr(sys, "argv", ["-"])  # python - < script.py
    assert interactive_session()
    monkeypatch.setattr(sys, "argv", ["train.py"])
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    assert interactive_session()


def test_ddp_from_an_interactive_session_points_to_ddp_notebook(monkeypatch):
    import torchfleet as tf
    from tests.distributed.scripts.ddp_train import build

    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    model, trainer, train, val = build({"strategy": "ddp", "devices": 2})
    with pytest.raises(ConfigurationError, match="ddp_notebook"):
        trainer.fit(model, train, val)
    assert isinstance(trainer.strategy, tf.strategies.DDPStrategy)


def test_unknown_start_method_is_refused():
    from torchfleet.environments import LocalEnvironment

    with pytest.raises(ConfigurationError, match="'spawn', 'fork', 'forkserver'"):
        ProcessLauncher(LocalEnvironment(), 2, 1, start_method="thread")
    with pytest.raises(ConfigurationError, match="'popen'"):
        DDPStrategy(start_method="thread")


def test_ddp_keywords_are_checked_against_distributed_data_parallel():
    with pytest.raises(ConfigurationError, match="'find_unused_parameter' \\(did you mean 'find_unused_parameters'\\?\\)"):
        DDPStrategy(find_unused_parameter=True)
    with pytest.raises(ConfigurationError, match="ddp_comm_hook"):
        DDPStrategy(ddp_comm_state=object())
    with pytest.raises(ConfigurationError, match="timeout"):
        DDPStrategy(timeout=-1)
    s = DDPStrategy(static_graph=True, bucket_cap_mb=1, gradient_as_bucket_view=True, timeout=5)
    assert s.timeout.total_seconds() == 5


def test_registered_names_map_to_their_options():
    from torchfleet.strategies import StrategyRegistry

    assert StrategyRegistry.get("ddp").start_method == "popen"
    assert StrategyRegistry.get("ddp_spawn").start_method == "spawn"
    assert StrategyRegistry.get("ddp_fork").start_method == "fork"
    assert StrategyRegistry.get("ddp_notebook").start_method == "fork"
    assert StrategyRegistry.get("ddp_find_unused_parameters_true")._ddp_kwargs == {"find_unused_parameters": True}


def test_ddp_keywords_reach_distributed_data_parallel_in_a_one_process_group():
    import torch.distributed as dist

    from torchfleet.connector import resolve
    from torchfleet.environments.local import find_free_port

    s = resolve(strategy=DDPStrategy(static_graph=True, bucket_cap_mb=1), accelerator="cpu", devices=1)
    import os

    old = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(find_free_port()))
    try:
        s.setup_environment()
        wrapped = s.setup_module(Holder())
        assert wrapped.static_graph and wrapped.bucket_bytes_cap == 1024 * 1024
        assert s.unwrap(wrapped).__class__ is Holder
        assert s.process_group_backend == "gloo"
    finally:
        dist.destroy_process_group()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_gloo_across_machines_warns_when_the_hostname_is_loopback(monkeypatch, caplog):
    import socket

    from torchfleet.strategies import processes as ddp

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
    with caplog.at_level("WARNING", logger="torchfleet.strategies.processes"):
        ddp._warn_if_gloo_would_advertise_loopback("127.0.0.1")  # one machine: fine
        assert not caplog.records
        ddp._warn_if_gloo_would_advertise_loopback("10.1.2.3")
    assert "GLOO_SOCKET_IFNAME" in caplog.text
    caplog.clear()
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    ddp._warn_if_gloo_would_advertise_loopback("10.1.2.3")
    assert not caplog.records


class _NamedThread:
    """A live thread of this process whose kernel-visible name is ``name`` (what autograd's device threads show)."""

    def __init__(self, name: str) -> None:
        self.name, self._named, self._stop = name, threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import ctypes

        pr_set_name = 15
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_name, self.name.encode(), 0, 0, 0)
        self._named.set()
        self._stop.wait()

    def __enter__(self) -> _NamedThread:
        self._thread.start()
        self._named.wait(5)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names are read from /proc (Linux)")
def test_ddp_fork_is_refused_once_autograd_runs_device_threads():
    # On a machine with a GPU the first backward, even on the CPU, starts threads named pt_autograd_<i>,
    # and every process forked after that fails in backward. Here they are stood in for by a thread of that name.
    from tests.distributed.scripts.ddp_train import build
    from torchfleet.launchers.processes import autograd_device_threads

    with _NamedThread("pt_autograd_0"):
        assert autograd_device_threads() == ["pt_autograd_0"]
        model, trainer, train, val = build({"strategy": "ddp_fork", "devices": 2})
        with pytest.raises(ConfigurationError) as err:
            trainer.fit(model, train, val)
    text = str(err.value)
    assert "pt_autograd_0" in text and "ddp_spawn" in text and "accelerator='cpu'" in text
    assert "\n" not in text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names are read from /proc (Linux)")
def test_a_cpu_backward_without_an_accelerator_starts_no_device_threads():
    import os
    import subprocess

    code = ("import torch\nfrom torchfleet.launchers.processes import autograd_device_threads\n"
            "torch.nn.Linear(2, 1)(torch.ones(1, 2)).sum().backward()\nprint(autograd_device_threads())")
    # with CUDA hidden, as on a CPU machine, ddp_fork after a backward stays allowed
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_fork_check_never_asks_is_available(monkeypatch):
    # torch.cuda.is_available() starts the CUDA driver on a GPU machine, after which a fork is spoiled
    def starts_the_driver():
        raise AssertionError("torch.cuda.is_available() called before a fork")

    monkeypatch.setattr(torch.cuda, "is_available", starts_the_driver)
    from torchfleet.environments import LocalEnvironment

    launcher = ProcessLauncher(LocalEnvironment(), 2, 1, start_method="fork")
    fn, args, kwargs = launcher._check_can_start(print, (1,), {})
    assert fn is print and args == (1,)


@pytest.mark.parametrize(("strategy", "compatible"), [("ddp_fork", True), ("ddp_notebook", True), ("ddp_spawn", False),
                                                      ("ddp", False)])
def test_which_launchers_can_start_ranks_from_a_notebook(strategy, compatible):
    import torchfleet as tf

    trainer = tf.Trainer(strategy=strategy, accelerator="cpu", devices=2, logger=False)
    assert trainer.strategy.launcher.is_interactive_compatible is compatible


def test_a_one_process_ddp_run_leaves_no_rank_variables_behind(monkeypatch):
    """The launcher exports MASTER_PORT, WORLD_SIZE, LOCAL_RANK, ... for a run of one process; after it, the
    process's environment is what it was, so a later Trainer (after destroy_process_group) is not taken for a rank
    another launcher started and picks a fresh port."""
    import os

    import torch.distributed as dist

    from tests.helpers import quiet
    from torchfleet import Trainer
    from torchfleet.demos import BoringModel

    names = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NODE_RANK", "0")  # one the user exported stays as it was
    ports = []
    try:
        for _ in range(2):
            trainer = Trainer(strategy="ddp", devices=1, max_steps=1, **quiet())
            trainer.fit(BoringModel())
            assert trainer.world_size == 1
            ports.append(dist.distributed_c10d._get_default_store().underlying_store.port)
            assert {n: os.environ.get(n) for n in names} == dict.fromkeys(names) | {"NODE_RANK": "0"}
            dist.destroy_process_group()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert ports[0] != ports[1]  # the second run chose its own port: nothing stale was read back


def test_rank_zero_waits_longer_for_the_cause_of_a_lost_peer_error():
    from torchfleet.launchers.script import _cause_wait

    lost = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40000")
    assert _cause_wait(lost, interrupted=False) == 5.0
    assert _cause_wait(RuntimeError("boom in rank 0"), interrupted=False) == 1.0  # its own bug: reported at once
    assert _cause_wait(lost, interrupted=True) == 0.0  # the watcher already knows the cause
