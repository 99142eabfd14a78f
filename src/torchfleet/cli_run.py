"""``torchfleet run SCRIPT [options] [script arguments]``: start every process of a Fleet script on this node.

    torchfleet run train.py --devices 2 --strategy ddp --accelerator cpu -- --lr 0.1

Each process runs ``python SCRIPT ...`` with the rank variables our launchers use (MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, NODE_RANK, LOCAL_RANK) and the options as ``TF_FLEET_ACCELERATOR``,
``TF_FLEET_STRATEGY``, ``TF_FLEET_DEVICES``, ``TF_FLEET_NUM_NODES`` and ``TF_FLEET_PRECISION``,
which ``Fleet()`` reads for the arguments it is not given (``torchfleet.fleet.RUN_ENV``). The
processes exist before the script runs, so ``fleet.setup`` works with or without ``fleet.launch()``.
The first process that fails stops the others, and the command exits non-zero naming its rank; with
``--max-restarts N`` it starts them all again instead, up to N times (``TF_RESTART_COUNT`` set).
Several machines: run the command on each with ``--num-nodes``, ``--node-rank``, and the same
``--main-address`` (node 0's) and ``--main-port``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from torchfleet.errors import ConfigurationError
from torchfleet.launchers.base import RUN_RESTARTS_VAR, ProcessFailedError, check_max_restarts, say_restart
from torchfleet.preemption import RESTART_COUNT_VAR

_DESCRIPTION = (
    "Start the processes of a script that trains with torchfleet.Fleet: --devices processes on this node, each "
    "running `python SCRIPT [script arguments]`; Fleet() with no arguments takes --accelerator, --strategy, "
    "--devices, --num-nodes and --precision from the environment this command sets (TF_FLEET_*)."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchfleet run", description=_DESCRIPTION)
    parser.add_argument("script", metavar="SCRIPT", help="the Python file to run")
    parser.add_argument("--accelerator", default=None,
                        help="cpu, cuda, mps or auto (default: what the script's Fleet says, else auto)")
    parser.add_argument("--strategy", default=None,
                        help="a registered strategy that runs one process per device: ddp, fsdp, deepspeed, "
                             "single_device, dp (default: what the script's Fleet says, else auto)")
    parser.add_argument("--devices", default="1",
                        help="devices per node: a count ('2'), ids ('0,1'), -1 or auto; on the CPU the number "
                             "of processes (default: 1)")
    parser.add_argument("--num-nodes", type=int, default=1, help="machines in the run (default: 1)")
    parser.add_argument("--node-rank", type=int, default=0, help="this machine's index, 0..num-nodes-1 (default: 0)")
    parser.add_argument("--main-address", default=None,
                        help="node 0's address (default: MASTER_ADDR, else 127.0.0.1)")
    parser.add_argument("--main-port", type=int, default=None,
                        help="the port node 0 listens on (default: MASTER_PORT, else a free port; with several "
                             "nodes give it on each)")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="when a process fails, stop them all and start them all again, up to this many times; "
                             "the script resumes itself (Fleet.restart_count) (default: 0, fail at once)")
    parser.add_argument("--precision", default=None,
                        help="32-true, bf16-mixed, 16-mixed, ... (default: what the script's Fleet says, else 32-true)")
    parser.epilog = ("Arguments the command does not know go to the script; put the script's own arguments after "
                     "`--` when their names are among the options above.")
    return parser


def run(argv: list[str]) -> int:
    """Run ``torchfleet run`` with ``argv`` (the arguments after ``run``); return the exit code."""
    ours, after = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    try:
        args, unknown = _parser().parse_known_args(ours)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    script_args = [*unknown, *after]
    _check(args)
    # None: not given, the script's Fleet(...) decides (devices and num_nodes decide how many processes start here)
    settings = {"accelerator": args.accelerator, "strategy": args.strategy, "devices": args.devices,
                "num_nodes": str(args.num_nodes), "precision": args.precision}
    address = args.main_address or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = args.main_port or (int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else None)
    if port is None:
        if args.num_nodes > 1:
            raise ConfigurationError(
                f"torchfleet run --num-nodes {args.num_nodes} needs --main-port (or MASTER_PORT): every node must "
                "be given the same port, on which node 0 (--main-address) listens."
            )
        from torchfleet.environments import find_free_port

        port = find_free_port()
    if not 0 <= args.node_rank < args.num_nodes:  # num_nodes >= 1: _check
        raise ConfigurationError(
            f"torchfleet run --node-rank {args.node_rank} is not valid with --num-nodes {args.num_nodes}: give "
            f"0..{args.num_nodes - 1}, a different one on each machine."
        )
    check_max_restarts(args.max_restarts)
    if args.max_restarts and args.num_nodes > 1:
        raise ConfigurationError(
            f"torchfleet run --max-restarts {args.max_restarts} with --num-nodes {args.num_nodes}: each machine would "
            "restart its own processes alone. Use torchrun --max-restarts across machines, or a scheduler that "
            "requeues the job."
        )
    # resolved with what the processes will see, for the checks of the environment it runs
    with _environment(MASTER_ADDR=address, MASTER_PORT=str(port), NODE_RANK=str(args.node_rank)):
        num_processes = _processes_per_node(settings)
    restart = 0
    while True:
        try:
            return _start(args.script, script_args, settings, num_processes, args.num_nodes, args.node_rank, address,
                          port, restart)
        except ProcessFailedError as failure:
            if not say_restart(failure, failure.rank, restart, args.max_restarts,
                               f"starting all {num_processes} processes again"):
                print(f"torchfleet run: {failure}", file=sys.stderr)
                return failure.exitcode if failure.exitcode and failure.exitcode > 0 else 1
            restart += 1
            if not (args.main_port or os.environ.get("MASTER_PORT")):
                from torchfleet.environments import find_free_port

                port = find_free_port()  # the last run's rendezvous port may linger


def _check(args: argparse.Namespace) -> None:
    """The script and the numbers the command reads itself (the others are checked as Fleet checks them)."""
    if not os.path.isfile(args.script):
        what = "is a directory, not a Python file" if os.path.isdir(args.script) else "does not exist"
        raise ConfigurationError(
            f"the script {args.script!r} {what}. Give the path of a Python file, then the options, then the script's "
            "own arguments: torchfleet run train.py --devices 2 --strategy ddp -- --lr 0.1"
        )
    if args.num_nodes < 1:
        raise ConfigurationError(f"--num-nodes {args.num_nodes} is not valid: give the number of machines in the run, "
                                 "an int >= 1 (default: 1).")
    if args.main_port is not None and not 1 <= args.main_port <= 65535:
        raise ConfigurationError(f"--main-port {args.main_port} is not valid: give a TCP port, 1..65535, the same on "
                                 "every node (leave it out on one machine: a free port is picked).")
    env_port = os.environ.get("MASTER_PORT")
    if args.main_port is None and env_port and not (env_port.isdigit() and 1 <= int(env_port) <= 65535):
        raise ConfigurationError(f"The environment variable MASTER_PORT={env_port!r} is not a TCP port (1..65535); "
                                 "set it to one, or unset it, or give --main-port.")


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _processes_per_node(settings: dict[str, Any]) -> int:
    """Resolve the options as ``Fleet`` will (every argument error is raised here, before a process starts)."""
    from torchfleet.connector import resolve

    strategy = resolve(accelerator=settings["accelerator"] or "auto", devices=settings["devices"],
                       strategy=settings["strategy"] or "auto", precision=settings["precision"],
                       num_nodes=int(settings["num_nodes"]))
    launcher = strategy.launcher
    if launcher is not None and launcher.runs_in_children:
        raise ConfigurationError(
            f"torchfleet run --strategy {settings['strategy']} cannot be used: that strategy starts its processes "
            "itself from inside the script (spawn or fork). torchfleet run starts them from outside: use "
            "--strategy ddp (or fsdp, deepspeed), or run the script with python and let the strategy start them."
        )
    return strategy.num_processes


def _start(script: str, script_args: list[str], settings: dict[str, Any], num_processes: int, num_nodes: int,
           node_rank: int, address: str, port: int, restart: int = 0) -> int:
    """Start the processes and wait for them: 0, or 130 on Ctrl-C; the first failure is raised (the others stopped)."""
    from torchfleet.fleet import RUN_ENV
    from torchfleet.launchers.base import ERROR_DIR_VAR, LAUNCHER_PID_VAR, rank_env
    from torchfleet.launchers.supervise import Supervisor

    error_dir = tempfile.mkdtemp(prefix="torchfleet-run-")
    base = dict(os.environ)
    for name, value in settings.items():
        if value is not None:
            base[RUN_ENV[name][0]] = str(value)
    base.update({ERROR_DIR_VAR: error_dir, LAUNCHER_PID_VAR: str(os.getpid()), RUN_RESTARTS_VAR: "1"})
    if restart:
        base[RESTART_COUNT_VAR] = str(restart)
    base.pop("RANK", None)  # an exported RANK would make the processes look torchrun-started
    command = [sys.executable, script, *script_args]
    procs = [subprocess.Popen(command, env={**base, **rank_env(address, port, num_processes * num_nodes, node_rank,
                                                                local_rank)})
             for local_rank in range(num_processes)]
    supervisor = Supervisor(procs, list(range(num_processes)), error_dir, node_rank, num_processes)
    try:
        supervisor.wait()
    except KeyboardInterrupt:
        supervisor.stop()
        return 130
    finally:
        import shutil

        shutil.rmtree(error_dir, ignore_errors=True)
    return 0
