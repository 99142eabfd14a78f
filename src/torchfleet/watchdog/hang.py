"""Hang detection: a thread per rank that ends a rank waiting in one collective longer than ``hang_timeout``.

``start`` (in each rank, once its process group is up) opens the rank's black box and starts the thread, which wakes
every ``tick_for(hang_timeout)`` seconds. When this rank has waited in one collective longer than ``hang_timeout``,
or longer than ``probe_after`` in a different collective than the other ranks (desync.py), it writes its Python
stacks (faulthandler, every thread) beside its black box and ends the process with ``HANG_EXIT_CODE``. When the
launching process asks (the ``DUMP_REQUEST`` file appears in the run's folder: some rank failed or hung), it writes
its stacks too, and the launching process reports (report.py).

Under torchrun (no supervising launcher) each rank prints its own part of the report to stderr and exits non-zero;
the first rank to time out tells the others through the rendezvous store.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torchfleet.errors import ConfigurationError
from torchfleet.watchdog.blackbox import open_box, stacks_path
from torchfleet.watchdog.desync import local_desync, store_desync
from torchfleet.watchdog.nccl import dump_nccl_trace
from torchfleet.watchdog.numbering import attach_box, bounded_wait, in_failed_collective
from torchfleet.watchdog.report import own_part

#: the exit code of a rank that the watchdog ended because it waited in one collective longer than hang_timeout
HANG_EXIT_CODE = 76
#: the default ``hang_timeout`` (seconds), on CPU and GPU
DEFAULT_HANG_TIMEOUT_S = 300.0
#: files in the run's folder: the launching process asks every rank for its stacks; a rank says it fired
DUMP_REQUEST = "dump"
HANG_MARKER = "hang"
_STORE_KEY = "torchfleet/watchdog/hang"


def parse_hang_timeout(value: Any, owner: str = "Trainer") -> float | None:
    """``hang_timeout`` in seconds (None: no watchdog). Accepts seconds (int/float), a timedelta, None or 0."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        seconds = float("nan")
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise ConfigurationError(
            f"{owner}(hang_timeout={value!r}) is not valid: give the longest time, in seconds (a number or a "
            "datetime.timedelta), that a rank may wait in one collective before the run is stopped with a report "
            f"of what every rank was doing (default {DEFAULT_HANG_TIMEOUT_S:g}), or None or 0 to switch the "
            "watchdog off."
        )
    return seconds or None


@dataclass
class _Watch:
    folder: str
    rank: int
    world_size: int
    timeout: float | None
    supervised: bool
    store: Any
    nccl_prefix: str | None
    dumped: bool = False
    #: under torchrun, the other ranks' records read from the store when this rank found a desync
    peers: dict | None = None


_WATCH: _Watch | None = None


def start(rank: int, world_size: int, hang_timeout: float | None, folder: str | None, store: Any = None,
          nccl_prefix: str | None = None) -> None:
    """In a rank, after the process group is up: open its black box and start the watchdog thread (once)."""
    global _WATCH
    if _WATCH is not None:
        _WATCH.timeout = hang_timeout
        return
    supervised = folder is not None
    if folder is None:  # torchrun, srun: a folder of this rank's own, removed when the process exits
        import atexit
        import shutil

        folder = tempfile.mkdtemp(prefix=f"torchfleet-watch-{rank}-")
        atexit.register(shutil.rmtree, folder, True)
    attach_box(open_box(folder, rank))
    _WATCH = _Watch(folder, rank, world_size, hang_timeout, supervised, store, nccl_prefix)
    # a rank killed by a fatal signal (gloo aborts a process whose collective received the wrong size) leaves its
    # stacks: beside its black box under our launchers, on stderr under torchrun
    if not faulthandler.is_enabled():
        try:
            target = open(stacks_path(folder, rank) + ".fatal", "w") if supervised else sys.stderr  # noqa: SIM115
            faulthandler.enable(file=target, all_threads=True)
        except (OSError, ValueError, AttributeError):
            pass
    global _THREAD
    _THREAD = threading.Thread(target=_run, args=(_WATCH,), name="torchfleet-watchdog", daemon=True)
    _THREAD.start()
    import atexit

    atexit.register(stop)  # registered after the process group's teardown, so it runs before it


#: set at exit: the watchdog thread leaves its loop
_STOP = threading.Event()
_THREAD: threading.Thread | None = None
#: how long the exit waits for the watchdog thread to finish a call it is in (a store round trip)
STOP_JOIN_S = 5.0


def stop() -> None:
    """Stop the watchdog thread and wait for it: at exit, before the interpreter finalises.

    Left running, the daemon thread may be inside a C++ call that released the GIL (under torchrun it asks the
    rendezvous store every tick whether another rank fired) when Python finalises; taking the GIL back then ends the
    thread from inside that call's C++ frames, which aborts the process ("terminate called without an active
    exception", SIGABRT) after a run that finished: torchrun then reports the job failed.
    """
    _STOP.set()
    thread = _THREAD
    if thread is not None and thread is not threading.current_thread():
        thread.join(STOP_JOIN_S)


def tick_for(timeout: float | None) -> float:
    """How often the watchdog thread looks at this rank's record (seconds)."""
    if timeout is None:
        return 1.0
    return min(1.0, max(0.05, timeout / 10))


def _run(watch: _Watch) -> None:
    while not _STOP.wait(tick_for(watch.timeout)):  # a daemon thread, stopped at exit (stop)
        try:
            _check(watch)
        except Exception:  # noqa: BLE001 - the watchdog must never be what fails a run
            pass


def probe_after(timeout: float | None) -> float:
    """How long a rank waits in one collective before it compares its record with the other ranks' (desync)."""
    return min(2.0, timeout / 2) if timeout else 2.0


def _check(watch: _Watch) -> None:
    timeout = watch.timeout
    waited = bounded_wait(time.monotonic()) if timeout is not None else None
    if waited is not None:
        if waited > timeout:
            _fire(watch)
            return
        if waited > probe_after(timeout) and _desynchronised(watch):
            _fire(watch, "found the ranks waiting in different collectives (a desync)")
            return
    if watch.dumped:
        return
    if watch.supervised:
        if os.path.exists(os.path.join(watch.folder, DUMP_REQUEST)):
            write_stacks(watch)
    elif watch.store is not None and watch.store.check([_STORE_KEY]):
        # torchrun: another rank timed out; print this rank's part, then leave (torchrun stops the rest)
        sys.stderr.write(_own_part(watch, "stops: another rank found a hang or a desync"))
        sys.stderr.flush()
        _exit_unsupervised(watch)


def _desynchronised(watch: _Watch) -> bool:
    """Whether the ranks wait in different collectives: read from the boxes beside this one's, or under torchrun
    from the rendezvous store (then their records are kept for this rank's report)."""
    if watch.supervised:
        return local_desync(watch.folder, probe_after(watch.timeout))
    if watch.store is None:
        return False
    fresh = 4 * tick_for(watch.timeout) + 1.0  # a record older than this belongs to an earlier wait
    peers = store_desync(watch.store, watch.rank, watch.world_size, fresh)
    if peers is None:
        return False
    watch.peers = peers
    return True


def _exit_unsupervised(watch: _Watch) -> None:
    """Under torchrun: remove this rank's own folder (atexit does not run after os._exit), end with HANG_EXIT_CODE."""
    import shutil

    shutil.rmtree(watch.folder, ignore_errors=True)
    os._exit(HANG_EXIT_CODE)


def write_stacks(watch: _Watch) -> None:
    """This rank's Python stacks (every thread) beside its black box, once."""
    watch.dumped = True
    path = stacks_path(watch.folder, watch.rank)
    with open(path + ".tmp", "w") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
    os.replace(path + ".tmp", path)


def _fire(watch: _Watch, why: str | None = None) -> None:
    """This rank waited too long in one collective (or in a different one than others): dump, tell, end."""
    nccl = dump_nccl_trace(watch.rank) if watch.nccl_prefix else None
    if not watch.supervised:
        if watch.store is not None:
            try:
                watch.store.set(_STORE_KEY, str(watch.rank))
            except Exception:  # noqa: BLE001
                pass
        sys.stderr.write(_own_part(watch, why or f"waited longer than hang_timeout={watch.timeout:g}s", nccl))
        sys.stderr.flush()
        time.sleep(min(2.0, 4 * tick_for(watch.timeout)))  # the others' watchdogs see the store key and print
        _exit_unsupervised(watch)
    write_stacks(watch)
    try:
        with open(os.path.join(watch.folder, HANG_MARKER), "w") as f:
            f.write(f"{watch.rank} {watch.timeout}")
    except OSError:
        pass
    handler = _in_process_supervisor
    if handler is not None:
        handler(watch)  # the launching process is this rank (ddp's rank 0): it reports and exits
    os._exit(HANG_EXIT_CODE)


#: set by the script launcher in rank 0, which is also the launching process: reports a hang of this rank itself
_in_process_supervisor: Any = None


def set_in_process_supervisor(handler: Any) -> None:
    """The script launcher's rank 0 (also the launching process) reports a hang of its own rank through ``handler``."""
    global _in_process_supervisor
    _in_process_supervisor = handler


def explain_failure(exc: BaseException) -> None:
    """Under torchrun: a rank whose collective failed (the peer aborted, "Connection reset by peer") prints its part."""
    watch = _WATCH
    if watch is None or watch.supervised or not in_failed_collective():
        return
    summary = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    sys.stderr.write(_own_part(watch, f"failed in a collective ({type(exc).__name__}: {summary})"))
    sys.stderr.flush()


def _own_part(watch: _Watch, why: str, nccl: str | None = None) -> str:
    return own_part(watch.rank, watch.world_size, watch.folder, why, timeout=watch.timeout, peers=watch.peers,
                    nccl=nccl, nccl_prefix=watch.nccl_prefix)
