"""How the ranks of a multi-process strategy start and join: their options, the launcher, the process group.

``ProcessOptions`` holds the options every such strategy takes (process_group_backend, timeout, start_method,
max_restarts), checked once when built. ``launcher_for`` picks the launcher from ``start_method``: ``"popen"``
re-runs the script for local ranks 1..N-1, ``"spawn"``/``"fork"``/``"forkserver"`` run the function in N new
processes; under torchrun, srun or mpirun the processes already exist and the launcher starts none.
``join_process_group`` joins this rank to the torch.distributed group (once per process) and starts its hang
watchdog. ParallelStrategy uses all three, so every strategy built on it launches and joins the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from torchfleet import watchdog
from torchfleet.errors import ConfigurationError
from torchfleet.launchers.base import check_max_restarts, check_restarts_apply
from torchfleet.strategies.arguments import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    from torchfleet.environments.base import ClusterEnvironment
    from torchfleet.launchers.base import Launcher

log = logging.getLogger(__name__)

START_METHODS = ("popen", "spawn", "fork", "forkserver")


@dataclasses.dataclass(frozen=True)
class ProcessOptions:
    """How a multi-process strategy's ranks start and join, checked when built.

    ``process_group_backend``: None picks the default for the device type (nccl on CUDA, gloo on CPU).
    ``timeout``: how long a collective may wait (a timedelta, or seconds > 0; None: torch's default).
    ``start_method``: "popen", "spawn", "fork" or "forkserver". ``max_restarts``: how many times every rank is
    started again (resuming from the newest checkpoint) after one fails.
    """

    process_group_backend: str | None = None
    timeout: timedelta | None = DEFAULT_TIMEOUT
    start_method: str = "popen"
    max_restarts: int = 0

    def __post_init__(self) -> None:
        if self.start_method not in START_METHODS:
            raise ConfigurationError(
                f"start_method={self.start_method!r} is not understood. Accepted: 'popen' (re-run the script for each "
                "rank; strategy='ddp'), 'spawn' ('ddp_spawn'), 'fork' ('ddp_fork', 'ddp_notebook') and "
                "'forkserver'."
            )
        object.__setattr__(self, "timeout", _as_timeout(self.timeout))
        check_max_restarts(self.max_restarts)

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> ProcessOptions:
        """The options among a constructor's ``given`` keywords (those absent keep their defaults)."""
        return cls(**{f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given})


def _as_timeout(timeout: Any) -> timedelta | None:
    if timeout is None or isinstance(timeout, timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigurationError(
            f"timeout={timeout!r} is not valid: give a datetime.timedelta or a number of seconds > 0."
        )
    return timedelta(seconds=timeout)


@dataclasses.dataclass(frozen=True)
class Rank:
    """This process in the run, as joining the process group needs it (ParallelStrategy.setup_distributed)."""

    environment: ClusterEnvironment
    world_size: int
    global_rank: int
    num_nodes: int
    device: torch.device
    backend: str
    timeout: timedelta | None
    hang_timeout: float | None


def launcher_for(options: ProcessOptions, env: ClusterEnvironment, num_processes: int, num_nodes: int) -> Launcher:
    """The launcher that starts this node's ranks as ``options.start_method`` says, with ``max_restarts`` applied."""
    launcher: Launcher
    if options.start_method == "popen":
        from torchfleet.launchers.script import ScriptLauncher

        launcher = ScriptLauncher(env, num_processes, num_nodes)
    else:
        from torchfleet.launchers.processes import ProcessLauncher

        launcher = ProcessLauncher(env, num_processes, num_nodes, options.start_method)
    apply_max_restarts(launcher, options, env, num_processes, num_nodes)
    return launcher


def apply_max_restarts(launcher: Launcher | None, options: ProcessOptions, env: ClusterEnvironment | None,
                       num_processes: int, num_nodes: int) -> None:
    """Give ``launcher`` the options' ``max_restarts``, and check restarts can apply to this launch."""
    if launcher is None:  # not configured yet: launcher_for applies it
        return
    launcher.max_restarts = options.max_restarts
    check_restarts_apply(options.max_restarts, env, num_processes, num_nodes)


def join_process_group(rank: Rank) -> None:
    """Join the process group of ``rank.world_size`` as ``rank.global_rank``, once per process; start the watchdog.

    A process already in a group of this world size (an earlier Trainer or Fleet in the script) keeps it.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        have = dist.get_world_size()
        if have != rank.world_size:
            raise ConfigurationError(
                f"This process already belongs to a process group of {have} processes, but this run asks for "
                f"{rank.world_size}. One script trains with one world size: give every Trainer/Fleet the same "
                "devices and num_nodes, or call torch.distributed.destroy_process_group() between them."
            )
        _start_watchdog(rank, None)
        return
    env = rank.environment
    assert env is not None
    backend = rank.backend
    # env:// rendezvous with explicit ranks; torchrun's agent store is used when torchrun provides one
    os.environ.setdefault("MASTER_ADDR", env.main_address)
    os.environ.setdefault("MASTER_PORT", str(env.main_port))
    if backend == "gloo":
        _warn_if_gloo_would_advertise_loopback(os.environ["MASTER_ADDR"])
    kwargs: dict[str, Any] = {}
    if rank.timeout is not None:
        kwargs["timeout"] = rank.timeout
    if rank.device.type == "cuda":
        kwargs["device_id"] = rank.device
    log.debug("init_process_group(%s) rank %d of %d at %s:%s", backend, rank.global_rank, rank.world_size,
              os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
    nccl_prefix = None
    if backend == "nccl" and rank.hang_timeout is not None:
        from torchfleet.launchers.supervise import rank_error_dir

        nccl_prefix = watchdog.nccl_flight_recorder_env(run_dir=rank_error_dir())
    store = _loopback_store(rank)
    if store is not None:
        kwargs["store"] = store
    dist.init_process_group(backend, world_size=rank.world_size, rank=rank.global_rank, **kwargs)
    atexit.register(_destroy_process_group)
    _start_watchdog(rank, nccl_prefix)


def _loopback_store(rank: Rank) -> Any:
    """The rendezvous store of a one-machine run our launchers started, listening on 127.0.0.1 only; else None.

    torch's env:// store listens on every interface (``*:MASTER_PORT``) though every rank is on this machine.
    Across machines, or where torchrun/srun/mpirun started the ranks (their store, their address), env://.
    """
    from torchfleet.environments.local import LocalEnvironment

    # LocalEnvironment: our launchers (or a hand start) on this machine; the others' launchers own the rendezvous
    if rank.num_nodes != 1 or not isinstance(rank.environment, LocalEnvironment):
        return None
    import socket

    from torch.distributed import TCPStore

    port = int(os.environ["MASTER_PORT"])
    timeout = rank.timeout if rank.timeout is not None else DEFAULT_TIMEOUT
    if rank.global_rank != 0:
        return TCPStore("127.0.0.1", port, rank.world_size, False, timeout)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's: a restart's port may linger
    try:
        listener.bind(("127.0.0.1", port))
        listener.listen(max(128, rank.world_size))
    except OSError as exc:
        listener.close()
        raise ConfigurationError(
            f"Rank 0 cannot listen on 127.0.0.1:{port} (MASTER_PORT) for the other ranks: {exc.strerror}. Unset "
            "MASTER_PORT to let torchfleet pick a free port, or export one that is free."
        ) from None
    # the store takes the socket over (detach: Python must not close it under the store)
    return TCPStore("127.0.0.1", port, rank.world_size, True, timeout, master_listen_fd=listener.detach())


def _start_watchdog(rank: Rank, nccl_prefix: str | None) -> None:
    """Open this rank's collectives record and start its hang watchdog (watchdog.py), once per process."""
    if rank.world_size == 1:
        return
    from torch.distributed import distributed_c10d

    from torchfleet.launchers.supervise import rank_error_dir

    try:
        store = distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - torchrun's agent store may not be reachable this way
        store = None
    watchdog.start(rank.global_rank, rank.world_size, rank.hang_timeout, rank_error_dir(), store, nccl_prefix)


def _is_loopback(address: str) -> bool:
    import ipaddress
    import socket

    try:
        return ipaddress.ip_address(socket.gethostbyname(address)).is_loopback
    except (OSError, ValueError):
        return False


def _warn_if_gloo_would_advertise_loopback(main_address: str) -> None:
    """Across machines, gloo tells the others to reach this rank at the address its hostname resolves to.

    Many hosts map their own name to 127.0.0.1 in /etc/hosts; the other machines then connect to
    themselves and the run waits until the timeout. GLOO_SOCKET_IFNAME picks the interface instead.
    """
    import socket

    if os.environ.get("GLOO_SOCKET_IFNAME") or _is_loopback(main_address):
        return
    if _is_loopback(socket.gethostname()):
        log.warning(
            "MASTER_ADDR=%s is another machine, but this machine's name (%s) resolves to a loopback address, "
            "which gloo would give the other ranks to reach this one: they cannot, and the run would wait until "
            "the timeout. Set GLOO_SOCKET_IFNAME to the network interface the machines share (e.g. eth0), or fix "
            "the name's entry in /etc/hosts.", main_address, socket.gethostname(),
        )


_EXIT_GRACE_S = 0.1


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # A gloo worker thread drops the last collective's tensors a moment after the caller's wait() returns, and
        # dropping them takes the GIL; if the interpreter is already finalising by then, the process aborts
        # ("terminate called without an active exception", SIGABRT). destroy_process_group() does not join those
        # threads, so give them a moment, with the GIL released, while the interpreter is still whole.
        time.sleep(_EXIT_GRACE_S)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
