"""A re-run child of the script launcher (local ranks 1..N-1): how it fails without drowning the run's one report.

A child records its error for the launching process (local rank 0), which reports the run's first failure once;
the child prints nothing. When the launching process itself is gone (killed: SIGKILL, the out-of-memory killer; or
aborted inside C++), nobody is left to report: local rank 1 says so in one paragraph, with the collectives report
from the ranks' black boxes, and every child ends quietly instead of printing its own echo ("Connection closed by
peer") of rank 0's death.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from torchfleet import watchdog
from torchfleet.launchers.base import ERROR_DIR_VAR, LAUNCHER_PID_VAR
from torchfleet.launchers.supervise import (
    POLL_S,
    exit_if_peer_stopped_on_signal,
    mark_launched_child,
    remove_run_folder,
    watch_parent,
    write_error,
)
from torchfleet.preemption import Preempted


def run_as_child(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Run ``fn`` in a re-run child: its error is recorded for the launching process, which reports it."""
    _watch_launcher_once()
    _report_uncaught_once()
    mark_launched_child(os.environ.get(ERROR_DIR_VAR), int(os.environ.get("LOCAL_RANK", "0")))
    try:
        return fn(*args, **kwargs)
    except Preempted:
        raise  # not a failure: this rank saved with the others and exits with the preemption code
    except BaseException as exc:
        exit_if_peer_stopped_on_signal(os.environ.get(ERROR_DIR_VAR))
        _record_error(exc)
        _end_if_launcher_died(exc)
        raise


#: the error this child recorded for its launching process (which reports it: this rank does not print it)
_RECORDED: BaseException | None = None


def _record_error(exc: BaseException) -> None:
    global _RECORDED
    if write_error(os.environ.get(ERROR_DIR_VAR), int(os.environ.get("LOCAL_RANK", "0")), exc):
        _RECORDED = exc


def _launcher_alive() -> bool:
    pid = os.environ.get(LAUNCHER_PID_VAR)
    return bool(pid) and os.getppid() == int(pid)  # type: ignore[arg-type]


#: how long a failing child waits to see whether the launching process (rank 0) is gone: its sockets close before
#: the kernel hands its children to another parent, so a child's collective can fail a moment before it can tell
LAUNCHER_GONE_WAIT_S = 1.0
_GONE = threading.Lock()  # the main thread's error and the parent watch may both find the launcher gone


def _end_if_launcher_died(exc: BaseException | None) -> None:
    """When the launching process died (its death is what failed this rank's collective), end this process with
    the run's one report (local rank 1, which gives the death a moment to be seen) or quietly (the others); return
    while the launching process lives."""
    pid = os.environ.get(LAUNCHER_PID_VAR)
    if not os.environ.get(ERROR_DIR_VAR) or not pid:
        return
    deadline = time.monotonic() + (LAUNCHER_GONE_WAIT_S if os.environ.get("LOCAL_RANK") == "1" else 0.0)
    while os.getppid() == int(pid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if os.getppid() != int(pid):
        _launcher_gone(exc)


def _launcher_gone(exc: BaseException | None) -> None:
    """The launching process is gone: local rank 1 reports it once, every child exits 1 (never returns)."""
    _GONE.acquire()  # never released: the other thread waits here until this one ends the process
    if os.environ.get("LOCAL_RANK") == "1":
        try:
            sys.stderr.write(_launcher_gone_report(exc) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - the process must end all the same
            pass
        remove_run_folder(os.environ.get(ERROR_DIR_VAR, ""))
    os._exit(1)


#: what a rank's error says when a peer's connection went away: the echo of another process's death, not news
LOST_PEER = ("connection closed by peer", "connection reset by peer", "broken pipe", "socket closed")


def lost_peer(text: str) -> bool:
    """Whether an error's text says that a peer's connection went away."""
    text = text.lower()
    return any(s in text for s in LOST_PEER)


def _launcher_gone_report(exc: BaseException | None) -> str:
    error_dir = os.environ.get(ERROR_DIR_VAR, "")
    try:
        names = os.listdir(error_dir)
    except OSError:
        names = []
    boxes = sorted(int(n[len("collectives-"):-4]) for n in names if n.startswith("collectives-") and n.endswith(".bin"))
    kind, text = watchdog.report(error_dir, boxes) if boxes else ("", "")
    node = os.environ.get("NODE_RANK", "0")
    who = "rank 0" if node == "0" else f"local rank 0 of node {node}"
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            who = f"rank {dist.get_rank() - int(os.environ.get('LOCAL_RANK', '0'))}"
    except Exception:  # noqa: BLE001 - the rank is named as well as it can be
        pass
    line = (f"torchfleet: {who}, the launching process (pid {os.environ.get(LAUNCHER_PID_VAR)}), ended without "
            "reporting: it was killed (SIGKILL, the out-of-memory killer) or aborted inside C++, so every rank stops. "
            "The last complete checkpoint stays.")
    if exc is not None and not kind and not lost_peer(str(exc)):  # losing rank 0's connections is the echo
        first = str(exc).strip().splitlines()
        line += f" The other ranks then failed: {type(exc).__name__}: {first[0][:200] if first else ''}"
    return f"{line}\n{text}" if kind else line


_PARENT_WATCH: threading.Thread | None = None
_EXCEPTHOOK_SET = False


def _report_uncaught_once() -> None:
    """In a re-run child: an exception that ends the script outside a launch (a Fleet loop) is recorded too."""
    global _EXCEPTHOOK_SET
    if _EXCEPTHOOK_SET:
        return
    _EXCEPTHOOK_SET = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        exit_if_peer_stopped_on_signal(os.environ.get(ERROR_DIR_VAR))
        if value is not _RECORDED:  # an error raised inside a launch was recorded there already
            _record_error(value)
            _end_if_launcher_died(value)
        if value is _RECORDED:
            # the launching process reports the first rank that failed, once (or, when it is gone, local rank 1
            # does): printed here as well, the output would hold every rank's traceback, most of them echoes
            if not _launcher_alive():
                _launcher_gone(value)
            return
        previous(kind, value, tb)

    sys.excepthook = hook


def _watch_launcher_once() -> None:
    global _PARENT_WATCH
    pid = os.environ.get(LAUNCHER_PID_VAR)
    if _PARENT_WATCH is None and pid:
        _PARENT_WATCH = watch_parent(int(pid), on_orphaned=lambda: _launcher_gone(None))
