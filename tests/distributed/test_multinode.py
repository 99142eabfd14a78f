"""Multi-node training with real processes over gloo: by hand, under torchrun, under (simulated) SLURM.

Every "node" is one process started here (its other local ranks, if any, are started by torchfleet's
ScriptLauncher or by torchrun), all on this machine, talking over TCP on 127.0.0.1, or, where the
machine allows it, over a veth pair between two network namespaces. Each process runs
``scripts/multinode_train.py``; rank 0 writes what it saw (world size, gathered ranks, final weights)
and every rank writes its own ranks, which the tests read back.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.distributed.trainer_order import trainer_batches
from torchfleet.environments import find_free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "multinode_train.py"
#: per-process wall-clock limit: a rendezvous that hangs is killed here, far below torch's 30-minute default
TIMEOUT_S = 90
#: a launch that disagrees with devices x num_nodes must fail at least this much faster than TIMEOUT_S
PREFLIGHT_LIMIT_S = 45
BATCH = 4  # per rank
EPOCHS = 2

#: variable prefixes of launchers and schedulers (and torchfleet's own launcher variables): removed from every
#: child's environment so that the outer shell (a CI job under SLURM, say) cannot change what is detected
_CLUSTER_PREFIXES = ("SLURM_", "TORCHELASTIC_", "OMPI_", "PMI_", "MPI_", "MV2_", "JSM_", "LSB_", "TF_", "GLOO_")
_CLUSTER_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NODE_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "KUBERNETES_PORT"}


# ------------------------------------------------------------------------------------------------ helpers
def _child_env(**extra: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _CLUSTER_VARS and not k.startswith(_CLUSTER_PREFIXES)}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _free_port_in(lo: int, hi: int) -> int:
    """A port in [lo, hi] that is free right now (SLURM derives its port from the job id: 15000 + 4 digits)."""
    base = os.getpid() % (hi - lo + 1)
    for i in range(hi - lo + 1):
        port = lo + (base + 7919 * i) % (hi - lo + 1)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.skip(f"no free TCP port in {lo}..{hi}")


def _script_cmd(out: Path, **cfg: object) -> list[str]:
    return [sys.executable, str(SCRIPT), json.dumps({"out": str(out), **cfg})]


def _torchrun_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


@dataclass
class Ran:
    name: str
    pid: int
    returncode: int | None  # None: killed at the timeout
    seconds: float
    stdout: str
    stderr: str


def _run_together(procs: list[tuple[str, list[str], dict[str, str]]], tmp: Path, timeout: float = TIMEOUT_S) -> list[Ran]:
    """Start every (name, argv, env) at once; wait for all, killing the stragglers (and their children) at ``timeout``.

    Output goes to files (no pipe can fill up and block a rank); each process leads its own process group,
    so a timeout also kills the local ranks it started.
    """
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    started = []
    for name, argv, env in procs:
        out, err = open(logs / f"{name}.out", "w"), open(logs / f"{name}.err", "w")
        t0 = time.monotonic()
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                             cwd=tmp, start_new_session=True)
        started.append((name, p, t0, out, err))
    deadline = time.monotonic() + timeout
    results = []
    for name, p, t0, out, err in started:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
            code: int | None = p.returncode
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.monotonic() - t0
        if code is None:
            _kill_group(p)
        out.close()
        err.close()
        results.append(Ran(name, p.pid, code, seconds, (logs / f"{name}.out").read_text(),
                           (logs / f"{name}.err").read_text()))
    return results


def _kill_group(p: subprocess.Popen) -> None:
    """Stop a process that is still running, with the local ranks it started (its process group).

    SIGTERM first: torchrun starts its workers in sessions of their own and stops them on SIGTERM.
    p is not reaped before the SIGKILL, so its pid (and group id) cannot have been reused.
    """
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _report(results: list[Ran]) -> str:
    parts = []
    for r in results:
        status = "TIMED OUT (killed)" if r.returncode is None else f"exit {r.returncode}"
        parts.append(f"===== {r.name} (pid {r.pid}): {status} after {r.seconds:.1f}s\n"
                     f"----- stdout\n{r.stdout}\n----- stderr\n{r.stderr}")
    return "\n".join(parts)


def _assert_all_ok(results: list[Ran]) -> None:
    assert all(r.returncode == 0 for r in results), "a node process failed or hung:\n" + _report(results)


def _load(path: Path, results: list[Ran]) -> dict:
    assert path.exists(), f"{path.name} was not written:\n" + _report(results)
    return json.loads(path.read_text())


def _script_module():
    spec = importlib.util.spec_from_file_location("_tf_multinode_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference_weights(global_batch: int, epochs: int = EPOCHS, world_size: int = 2) -> tuple[dict[str, list[float]], int]:
    """One process, plain PyTorch: the script's model and data, batch ``global_batch``, same epochs, each step's
    samples those the ``world_size`` ranks of the Trainer read at that step (it shuffles, seed 0: trainer_order)."""
    script = _script_module()
    with torch.random.fork_rng():  # TinyNet seeds the global generator: leave this process's as it was
        model = script.TinyNet()
    opt = model.configure_optimizers()
    steps = 0
    data = script.make_data()
    for epoch in range(epochs):
        for idx in trainer_batches(len(data), world_size, global_batch // world_size, seed=0, epoch=epoch):
            x, y = data[idx]
            opt.zero_grad()
            nn.functional.mse_loss(model.net(x), y).backward()
            opt.step()
            steps += 1
    weights = {k: v.detach().double().flatten().tolist() for k, v in model.state_dict().items()}
    return weights, steps


def _check_training(result: dict, world_size: int) -> None:
    """The run's final weights are those of one process with the global batch; so is its step count."""
    expected, steps = _reference_weights(BATCH * world_size, world_size=world_size)
    assert result["global_step"] == steps
    assert set(result["weights"]) == set(expected)
    for name, values in expected.items():
        torch.testing.assert_close(torch.tensor(result["weights"][name], dtype=torch.float64),
                                   torch.tensor(values, dtype=torch.float64), atol=1e-6, rtol=0,
                                   msg=lambda m, name=name: f"{name}: {m}")


def _check_ranks(out: Path, results: list[Ran], devices: int, num_nodes: int, environment: str) -> dict:
    world = devices * num_nodes
    result = _load(out / "result.json", results)
    assert result["world_size"] == result["dist_world_size"] == world
    assert result["ranks"] == list(range(world)), "all_gather of the global ranks"
    assert result["node_ranks"] == [r // devices for r in range(world)]
    assert result["local_ranks"] == [r % devices for r in range(world)]
    assert result["environment"] == environment
    for node in range(num_nodes):
        for local in range(devices):
            info = _load(out / f"rank-n{node}-l{local}.json", results)
            assert info["global_rank"] == info["dist_rank"] == node * devices + local
            assert info["world_size"] == info["dist_world_size"] == world
            assert info["environment"] == environment
    return result


# ------------------------------------------------------------------------------------------ 1. by hand
@pytest.mark.parametrize("devices", [1, 2], ids=["1proc-per-node", "2procs-per-node"])
def test_two_nodes_by_hand(tmp_path, devices):
    """Each node runs the same command with MASTER_ADDR/MASTER_PORT/NODE_RANK; devices=2 starts a local rank 1."""
    num_nodes, world = 2, 2 * devices
    port = find_free_port()
    cmd = _script_cmd(tmp_path, devices=devices, num_nodes=num_nodes, batch=BATCH, epochs=EPOCHS)
    results = _run_together([
        (f"node{k}", cmd, _child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=k)) for k in range(num_nodes)
    ], tmp_path)
    _assert_all_ok(results)
    result = _check_ranks(tmp_path, results, devices, num_nodes, "LocalEnvironment")
    for k, node in enumerate(results):
        info = _load(tmp_path / f"rank-n{k}-l0.json", results)
        assert info["pid"] == node.pid, "local rank 0 of each node is the process started on that node"
        assert info["master_port"] == str(port)
        for local in range(1, devices):  # the extra local ranks were started by that node's own process
            assert _load(tmp_path / f"rank-n{k}-l{local}.json", results)["ppid"] == node.pid
    _check_training(result, world)


# ------------------------------------------------------------------------------------------ 2. torchrun
def test_two_nodes_torchrun(tmp_path):
    """Two torchrun invocations (static rendezvous), one process each; Trainer(devices=1, num_nodes=2)."""
    port = find_free_port()
    cmd = _script_cmd(tmp_path, devices=1, num_nodes=2, batch=BATCH, epochs=EPOCHS)
    results = _run_together([
        (f"torchrun-node{k}",
         _torchrun_cmd("--nnodes=2", f"--node-rank={k}", "--nproc-per-node=1", "--master-addr=127.0.0.1",
                       f"--master-port={port}", *cmd[1:]),
         _child_env())
        for k in range(2)
    ], tmp_path)
    _assert_all_ok(results)
    result = _check_ranks(tmp_path, results, 1, 2, "TorchElasticEnvironment")
    _check_training(result, 2)


# --------------------------------------------------------------------------------------- 3. SLURM
def _slurm_env(procid: int, nodeid: int, localid: int, ntasks: int, nnodes: int, ntasks_per_node: int | None,
               job_id: str, nodelist: str) -> dict[str, str]:
    """What srun sets for one task of an even layout: the variables SLURMEnvironment reads, and a few more.

    SLURM_TASKS_PER_NODE ("2", "1(x2)") is always set; SLURM_NTASKS_PER_NODE only with --ntasks-per-node.
    """
    per_node = ntasks // nnodes
    env = dict(
        SLURM_JOB_ID=job_id, SLURM_JOBID=job_id, SLURM_JOB_NAME="multinode_train.py", SLURM_STEP_ID=0,
        SLURM_NTASKS=ntasks, SLURM_NPROCS=ntasks, SLURM_NNODES=nnodes, SLURM_JOB_NUM_NODES=nnodes,
        SLURM_NODELIST=nodelist, SLURM_JOB_NODELIST=nodelist, SLURM_STEP_NODELIST=nodelist,
        SLURM_TASKS_PER_NODE=f"{per_node}(x{nnodes})" if nnodes > 1 else str(per_node),
        SLURM_PROCID=procid, SLURM_LOCALID=localid, SLURM_NODEID=nodeid,
    )
    if ntasks_per_node is not None:
        env["SLURM_NTASKS_PER_NODE"] = ntasks_per_node
    return _child_env(**env)


def test_two_nodes_simulated_slurm(tmp_path):
    """2 nodes x 1 task as srun starts them: no MASTER_ADDR/PORT, derived from SLURM_NODELIST and SLURM_JOB_ID."""
    port = _free_port_in(15000, 24999)
    job_id = f"31{port - 15000:04d}"  # SLURMEnvironment listens on 15000 + the last four digits of the job id
    nodelist = "127.0.0.1,127.0.0.2"  # the first host is the main address
    cmd = _script_cmd(tmp_path, devices=1, num_nodes=2, batch=BATCH, epochs=EPOCHS)
    results = _run_together([
        (f"task{k}", cmd, _slurm_env(k, k, 0, ntasks=2, nnodes=2, ntasks_per_node=1, job_id=job_id,
                                      nodelist=nodelist))
        for k in range(2)
    ], tmp_path)
    _assert_all_ok(results)
    result = _check_ranks(tmp_path, results, 1, 2, "SLURMEnvironment")
    for k in range(2):
        info = _load(tmp_path / f"rank-n{k}-l0.json", results)
        assert (info["master_addr"], info["master_port"]) == ("127.0.0.1", str(port))
    _check_training(result, 2)


# ------------------------------------------------------------------------------- 4. pre-flight mismatch
def _assert_preflight_failure(results: list[Ran], *needles: str) -> None:
    """Every process exited non-zero on its own, fast, naming the numbers; none got past Trainer(...)."""
    report = _report(results)
    for r in results:
        assert r.returncode is not None, f"{r.name} hung instead of failing the pre-flight check:\n{report}"
        assert r.returncode != 0, f"{r.name} did not fail:\n{report}"
        assert r.seconds < PREFLIGHT_LIMIT_S, f"{r.name} took {r.seconds:.0f}s to fail:\n{report}"
        assert "TRAINER_BUILT" not in r.stdout, f"{r.name} got past Trainer construction:\n{report}"
        for needle in needles:
            assert needle in r.stderr, f"{r.name}: {needle!r} not in its error:\n{report}"


def test_preflight_torchrun_nproc_disagrees(tmp_path):
    """torchrun --nproc-per-node=2 with Trainer(devices=1, num_nodes=1): fails in Trainer(...), not in a hang.

    torchrun stops the other workers as soon as one fails, so which worker reports first is a race;
    the test below starts the workers itself to check every one of them.
    """
    port = find_free_port()
    cmd = _script_cmd(tmp_path, devices=1, num_nodes=1)
    results = _run_together([
        ("torchrun", _torchrun_cmd("--nnodes=1", "--nproc-per-node=2", "--tee=3", "--master-addr=127.0.0.1",
                                   f"--master-port={port}", *cmd[1:]), _child_env()),
    ], tmp_path)
    (run,) = results
    report = _report(results)
    assert run.returncode is not None and run.returncode != 0, report
    assert run.seconds < PREFLIGHT_LIMIT_S, report
    assert "TRAINER_BUILT" not in run.stdout + run.stderr, report
    message = "torchrun started 2 processes (WORLD_SIZE=2), but the Trainer is configured for devices=1 x num_nodes=1"
    assert message in run.stdout + run.stderr, report
    assert not (tmp_path / "result.json").exists()


@pytest.mark.parametrize("strategy", ["ddp", "auto"])
def test_preflight_every_torchrun_worker_fails(tmp_path, strategy):
    """The two workers of torchrun --nproc-per-node=2, started here with torchrun's variables: both fail fast."""
    port = find_free_port()
    cmd = _script_cmd(tmp_path, devices=1, num_nodes=1, strategy=strategy)
    results = _run_together([
        (f"worker{k}", cmd, _child_env(
            TORCHELASTIC_RUN_ID=uuid.uuid4().hex[:8], RANK=k, LOCAL_RANK=k, GROUP_RANK=0, ROLE_RANK=k, WORLD_SIZE=2,
            LOCAL_WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCHELASTIC_USE_AGENT_STORE="False"))
        for k in range(2)
    ], tmp_path)
    _assert_preflight_failure(results, "ConfigurationError", "torchrun started 2 processes (WORLD_SIZE=2)",
                              "devices=1 x num_nodes=1")


@pytest.mark.parametrize("ntasks_per_node", [2, None], ids=["srun--ntasks-per-node=2", "srun-n2"])
def test_preflight_slurm_ntasks_disagrees(tmp_path, ntasks_per_node):
    """SLURM_NTASKS=2 on one node with Trainer(devices=3): every task fails in Trainer(...) naming 2 and 3."""
    port = _free_port_in(15000, 24999)
    job_id = f"52{port - 15000:04d}"
    cmd = _script_cmd(tmp_path, devices=3, num_nodes=1)
    results = _run_together([
        (f"task{k}", cmd, _slurm_env(k, 0, k, ntasks=2, nnodes=1, ntasks_per_node=ntasks_per_node, job_id=job_id,
                                     nodelist="127.0.0.1"))
        for k in range(2)
    ], tmp_path)
    _assert_preflight_failure(results, "ConfigurationError", "SLURM runs 2 tasks per node", "devices=3")


def test_preflight_slurm_message_names_the_variable_it_read(monkeypatch):
    """Minimal reproduction, no processes: srun -n 2 sets SLURM_TASKS_PER_NODE=2, not SLURM_NTASKS_PER_NODE."""
    from torchfleet.environments import SLURMEnvironment
    from torchfleet.errors import ConfigurationError

    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    for name, value in _slurm_env(0, 0, 0, ntasks=2, nnodes=1, ntasks_per_node=None, job_id="1",
                                  nodelist="127.0.0.1").items():
        if name.startswith("SLURM_"):
            monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as info:
        SLURMEnvironment().validate_settings(3, 1)
    assert "SLURM_TASKS_PER_NODE=2" in str(info.value)
    assert "SLURM_NTASKS_PER_NODE" not in str(info.value)


# ------------------------------------------------------------------------ 5. two network namespaces
@dataclass
class Namespaces:
    names: tuple[str, str]
    interfaces: tuple[str, str]
    addresses: tuple[str, str]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture
def veth_namespaces():
    """Two network namespaces joined by a veth pair (10.77.0.1/24 <-> 10.77.0.2/24); removed afterwards."""
    why = "needs root and iproute2 to create network namespaces (ip netns add / ip link add ... type veth)"
    if shutil.which("ip") is None:
        pytest.skip(f"{why}: no `ip` command")
    tag = f"{os.getpid() % 100000}"
    probe = f"tf-probe-{tag}"
    try:
        made = _ip("netns", "add", probe, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"{why}: {exc}")
    if made.returncode != 0:
        pytest.skip(f"{why}: {made.stderr.strip()}")
    _ip("netns", "del", probe, check=False)

    ns = Namespaces((f"tf-node0-{tag}", f"tf-node1-{tag}"), (f"tfv0-{tag}", f"tfv1-{tag}"), ("10.77.0.1", "10.77.0.2"))
    try:
        for name in ns.names:
            _ip("netns", "add", name)
        try:
            _ip("link", "add", ns.interfaces[0], "type", "veth", "peer", "name", ns.interfaces[1])
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"{why}: cannot create a veth pair: {exc.stderr.strip()}")
        for name, iface, addr in zip(ns.names, ns.interfaces, ns.addresses):
            _ip("link", "set", iface, "netns", name)
            _ip("-n", name, "addr", "add", f"{addr}/24", "dev", iface)
            _ip("-n", name, "link", "set", iface, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        yield ns
    finally:
        for name in ns.names:  # deleting a namespace deletes the veth end inside it, and with it the pair
            _ip("netns", "del", name, check=False)
        _ip("link", "del", ns.interfaces[0], check=False)  # in case it never moved into a namespace


def test_two_nodes_over_veth_network_namespaces(tmp_path, veth_namespaces):
    """Each node in its own network namespace: rank 0 listens on 10.77.0.1, node 1 reaches it over the veth pair.

    GLOO_SOCKET_IFNAME names each node's interface: this machine's hostname resolves to 127.0.0.1 (as in
    many /etc/hosts files), and gloo would otherwise advertise the loopback address to the other node.
    """
    ns = veth_namespaces
    port = find_free_port()
    cmd = _script_cmd(tmp_path, devices=1, num_nodes=2, batch=BATCH, epochs=EPOCHS)
    results = _run_together([
        (f"node{k}", ["ip", "netns", "exec", ns.names[k], *cmd],
         _child_env(MASTER_ADDR=ns.addresses[0], MASTER_PORT=port, NODE_RANK=k, GLOO_SOCKET_IFNAME=ns.interfaces[k]))
        for k in range(2)
    ], tmp_path)
    _assert_all_ok(results)
    result = _check_ranks(tmp_path, results, 1, 2, "LocalEnvironment")
    assert _load(tmp_path / "rank-n1-l0.json", results)["master_addr"] == "10.77.0.1"
    _check_training(result, 2)
