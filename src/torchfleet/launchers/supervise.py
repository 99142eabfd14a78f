"""Watching the processes of a run: report the first rank that fails and stop the others.

Shared by the script launcher (children are ``subprocess.Popen``) and the process launcher
(children are ``multiprocessing.Process``). Each child writes its traceback to
``<error_dir>/rank-<local_rank>.txt`` before it exits with an error, so the launching process
can name the failing rank and quote its exception, not only its exit code.

A child that exits with ``preemption.EXIT_CODE`` (75) has not failed: it saved the preemption
checkpoint with the other ranks and stopped, so the others are left to finish their save. Before
the supervisor stops children on purpose it creates ``<error_dir>/stopping``: a child's preemption
handler then lets that SIGTERM end it at once instead of treating it as a request to save.

A child that stops on a signal where the ranks could not agree to stop together leaves its one line in
``<error_dir>/signal-stop-<local_rank>.txt`` and exits with 75; one ended by SIGTERM/SIGINT/SIGUSR1
from outside before it could handle it is read the same way. Either stops every other process of the
launch at once (``signal_stop``), and the run ends with exit code 75 and that one line.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from torchfleet.launchers.base import ERROR_DIR_VAR, STOP_GRACE_S, ProcessFailedError, describe_exit
from torchfleet.preemption import EXIT_CODE as PREEMPTED_EXIT_CODE
from torchfleet.preemption import SIGNALS, Preempted
from torchfleet.signals import set_stop_marker, set_unagreed_stop
from torchfleet.watchdog import DUMP_REQUEST, HANG_EXIT_CODE, HANG_MARKER, stacks_path
from torchfleet.watchdog import report as collectives_report

POLL_S = 0.05
#: how long the launching process waits for the live ranks' stacks when it reports a hang or a desync
STACKS_WAIT_S = 3.0
#: the file whose existence tells the children that a SIGTERM comes from their launcher stopping them
STOP_MARKER = "stopping"
#: the file a child leaves its one line in before it exits on a signal without the other ranks
SIGNAL_STOP_PREFIX = "signal-stop-"
#: the exit codes of a child that a preemption signal ended before it had a handler (the default action)
_SIGNAL_DEATHS = {-int(sig) for sig in SIGNALS}


def _exitcode(proc: Any) -> int | None:
    # Popen has poll(); multiprocessing.Process has exitcode
    poll = getattr(proc, "poll", None)
    return poll() if poll is not None else proc.exitcode


#: in the launching process of the script launcher, which is also local rank 0: its run's folder
_OWN_ERROR_DIR: str | None = None


def rank_error_dir() -> str | None:
    """The folder where this rank reports to its launching process (None under torchrun, srun, or one process)."""
    return os.environ.get(ERROR_DIR_VAR) or _OWN_ERROR_DIR


def set_own_error_dir(path: str | None) -> None:
    global _OWN_ERROR_DIR
    _OWN_ERROR_DIR = path


def remove_run_folder(path: str) -> None:
    """Remove a launch's folder, except the NCCL flight recorder dumps a report may have pointed to."""
    import shutil

    trace = os.path.join(path, "nccl-trace")  # watchdog.nccl_flight_recorder_env's, under nccl
    if not (os.path.isdir(trace) and os.listdir(trace)):
        shutil.rmtree(path, ignore_errors=True)
        return
    for name in os.listdir(path):
        entry = os.path.join(path, name)
        if name == "nccl-trace":
            continue
        if os.path.isdir(entry):
            shutil.rmtree(entry, ignore_errors=True)
        else:
            os.unlink(entry)


def error_file(error_dir: str, local_rank: int) -> str:
    return os.path.join(error_dir, f"rank-{local_rank}.txt")


def signal_stop_file(error_dir: str, local_rank: int) -> str:
    return os.path.join(error_dir, f"{SIGNAL_STOP_PREFIX}{local_rank}.txt")


def exit_if_peer_stopped_on_signal(error_dir: str | None) -> None:
    """In a launched child that failed: when another rank stopped on a signal, the failure is its echo (its
    sockets closed): leave quietly with exit code 75; the launcher says why, once."""
    try:
        names = os.listdir(error_dir) if error_dir else []
    except OSError:  # the folder is gone: the rank that reported for a dead launcher removed it
        return
    if any(n.startswith(SIGNAL_STOP_PREFIX) for n in names):
        os._exit(PREEMPTED_EXIT_CODE)


def report_when_uncaught() -> None:
    """In a launching process about to raise a ProcessFailedError: should it end the program uncaught, Python's last
    words are the report alone, ``torchfleet: <report>`` (the failing rank's own traceback, once, not this process's
    frames that only passed it on), and the process exits with the watchdog's code (76) for a hang or a desync.

    Installed at the raise, so it is the outermost hook even after torch's (which prefixes ``[rankN]:``: the report
    speaks for the run, not for this process). A program that catches the error is unaffected.
    """
    if getattr(sys.excepthook, "torchfleet_report", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if isinstance(value, ProcessFailedError):
            end_with_report(value)
        else:
            previous(kind, value, tb)

    hook.torchfleet_report = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def mark_launched_child(error_dir: str | None, local_rank: int = 0) -> None:
    """In a launched child: a SIGTERM after the launcher created its stop marker ends this process at once; a
    signal it stops on without the other ranks is handed to the launcher in a file; Ctrl-C ends it quietly
    (the launcher says why) instead of a KeyboardInterrupt traceback in every rank."""
    set_stop_marker(os.path.join(error_dir, STOP_MARKER) if error_dir else None)
    if not error_dir:
        return

    def hand_over(line: str) -> None:
        path = signal_stop_file(error_dir, local_rank)
        with open(path + ".tmp", "w") as f:
            f.write(line)
        os.replace(path + ".tmp", path)

    set_unagreed_stop(hand_over)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is \
            signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)


def write_error(error_dir: str | None, local_rank: int, exc: BaseException) -> bool:
    """Record ``exc`` with its traceback for the launching process; whether it was written (best effort: the error
    itself still propagates, and a rank whose record could not be written prints it itself)."""
    if not error_dir:
        return False
    try:
        text = rank_traceback(exc)
    except Exception:  # noqa: BLE001 - a report that cannot be shortened is reported whole
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        tmp = error_file(error_dir, local_rank) + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, error_file(error_dir, local_rank))
    except OSError:
        return False
    return True


def rank_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as a failed rank's report shows it: the user's own frames, and every frame below the last
    of them (where the error was raised, library code included); the frames of torchfleet, torch and Python that
    merely lead from the script to the user's hook are summed up in one line each run. Without any frame of the
    user's (an error inside torchfleet), every frame is kept. Chained exceptions are kept, shortened the same way.
    """
    roots = _library_roots()
    return "".join(_format_chain(traceback.TracebackException.from_exception(exc), roots))


def _library_roots() -> list[tuple[str | None, str]]:
    """(name, folder) of the code that is not the user's, most specific first; name None: a site-packages folder,
    whose sub-folders name the packages."""
    import sysconfig

    import torchfleet

    paths = sysconfig.get_paths()
    roots: list[tuple[str | None, str]] = [("torchfleet", os.path.dirname(os.path.abspath(torchfleet.__file__)))]
    roots += [(None, paths[k]) for k in ("purelib", "platlib")] + [("python", paths["stdlib"])]
    return [(name, os.path.join(os.path.abspath(folder), "")) for name, folder in roots]


def _frame_owner(filename: str, roots: list[tuple[str | None, str]]) -> str | None:
    """The library a frame's file belongs to ("torchfleet", "torch", "python", ...); None for the user's own code."""
    if filename.startswith("<"):  # "<frozen runpy>" is Python's; "<string>" (python -c) and "<stdin>" the user's
        return "python" if filename.startswith("<frozen") else None
    path = os.path.abspath(filename)
    for name, root in roots:
        if path.startswith(root):
            return name or path[len(root):].split(os.sep)[0].removesuffix(".py")
    return None


def _format_chain(te: traceback.TracebackException, roots: list[tuple[str | None, str]]) -> list[str]:
    lines: list[str] = []
    if te.__cause__ is not None:
        lines += _format_chain(te.__cause__, roots)
        lines.append("\nThe above exception was the direct cause of the following exception:\n\n")
    elif te.__context__ is not None and not te.__suppress_context__:
        lines += _format_chain(te.__context__, roots)
        lines.append("\nDuring handling of the above exception, another exception occurred:\n\n")
    if te.stack:
        lines.append("Traceback (most recent call last):\n")
        owners = [_frame_owner(frame.filename, roots) for frame in te.stack]
        last_own = max((i for i, owner in enumerate(owners) if owner is None), default=-1)
        hidden: list[str] = []
        for i, (frame, owner) in enumerate(zip(te.stack, owners)):
            if owner is not None and i < last_own:
                hidden.append(owner)
                continue
            if hidden:
                lines.append(f"  ... {len(hidden)} frame{'s' if len(hidden) > 1 else ''} of "
                             f"{', '.join(dict.fromkeys(hidden))}\n")
                hidden = []
            lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}\n')
            if frame.line:
                lines.append(f"    {frame.line.strip()}\n")
    lines += list(te.format_exception_only())
    return lines


def report_stream() -> Any:
    """Where the launching process writes its one report: its own stderr, not the buffer torch's excepthook swaps
    in (for every thread) while it prefixes "[rankN]:" to what the main thread's excepthook prints, which a report
    written from another thread meanwhile would never leave once the process ends with ``os._exit``."""
    return sys.__stderr__ if isinstance(sys.stderr, io.StringIO) and sys.__stderr__ else sys.stderr


def say_report(failure: Any) -> Any:
    """Write ``torchfleet: <failure>`` to :func:`report_stream` and flush it; returns the stream."""
    stream = report_stream()
    stream.write(f"torchfleet: {failure}\n")
    stream.flush()
    return stream


def end_with_report(failure: ProcessFailedError) -> None:
    """From an excepthook of the launching process, as the program ends on ``failure``: say it once, and for a hang
    or a desync end with the watchdog's exit code (76; Python would exit with 1) after what Python runs at exit."""
    stream = say_report(failure)
    if failure.diagnosis in ("hang", "desync"):
        import atexit

        atexit._run_exitfuncs()  # Python's own exit would run them (this clears them)
        for out in (sys.stdout, stream):
            try:
                out.flush()
            except (OSError, ValueError):
                pass
        os._exit(HANG_EXIT_CODE)


class Supervisor:
    """The children of one launch: ``ranks[i]`` is the local rank of ``procs[i]``.

    ``self_rank``: the local rank this (launching) process runs itself, if any (ddp's rank 0).
    """

    def __init__(self, procs: Sequence[Any], ranks: Sequence[int], error_dir: str, node_rank: int, num_processes: int,
                 self_rank: int | None = None):
        self.procs, self.ranks = list(procs), list(ranks)
        self.error_dir = error_dir
        self.node_rank, self.num_processes = node_rank, num_processes
        self.self_rank = self_rank
        self.failure: ProcessFailedError | None = None
        self._lock = threading.RLock()  # the watcher thread and the main thread may both look

    def _global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.num_processes + local_rank

    def failed(self, rank: int, exitcode: int | None) -> ProcessFailedError:
        """The error for the child at local ``rank``: its recorded traceback, else its exit code.

        ``failed_at`` is when the traceback was written; 0 for a child that left none (killed by a
        signal, or ``os._exit``): that is a cause, never an echo of another rank's failure.
        """
        path = error_file(self.error_dir, rank)
        try:
            with open(path) as f:
                detail = f.read()
            failed_at = os.stat(path).st_mtime
        except OSError:
            detail = (f"it left no Python traceback{describe_exit(exitcode)}; its own output above may say more."
                      if exitcode is not None else "it left no Python traceback.")
            failed_at = 0.0
        if exitcode == HANG_EXIT_CODE and os.path.exists(os.path.join(self.error_dir, HANG_MARKER)):
            detail = "its watchdog stopped it: it waited in one collective longer than hang_timeout."
        error = ProcessFailedError(self._global_rank(rank), detail, exitcode)
        error.failed_at = failed_at
        return error

    def _local_ranks(self) -> list[int]:
        return sorted({*self.ranks, *([self.self_rank] if self.self_rank is not None else [])})

    def diagnose(self, failure: ProcessFailedError, hang_rank: int | None = None) -> ProcessFailedError:
        """``failure`` with the collectives report appended when the ranks hung or desynchronised.

        Reads every rank's black box (watchdog.py); when the report says hang or desync, asks the live ranks
        for their Python stacks first (the ``dump`` file their watchdogs look for) and waits for them a moment.
        """
        hung = hang_rank is not None or (failure.exitcode == HANG_EXIT_CODE
                                         and os.path.exists(os.path.join(self.error_dir, HANG_MARKER)))
        ranks = [self._global_rank(r) for r in self._local_ranks()]
        kind, _ = collectives_report(self.error_dir, ranks)
        if not hung and kind != "desync":
            return failure
        try:
            with open(os.path.join(self.error_dir, DUMP_REQUEST), "w"):
                pass
        except OSError:
            return failure
        alive = [self._global_rank(r) for p, r in zip(self.procs, self.ranks) if _exitcode(p) is None]
        if self.self_rank is not None:
            alive.append(self._global_rank(self.self_rank))
        deadline = time.monotonic() + STACKS_WAIT_S
        while time.monotonic() < deadline and not all(os.path.exists(stacks_path(self.error_dir, r)) for r in alive):
            time.sleep(POLL_S)
        timeout = _hang_timeout(self.error_dir)
        kind, text = collectives_report(self.error_dir, ranks, timeout)
        rank = hang_rank if hang_rank is not None else failure.rank
        how = ("its watchdog stopped it" if hung else f"it failed{describe_exit(failure.exitcode)}")
        if kind == "desync":
            head = f"The ranks desynchronised (rank {rank} noticed first: {how}), so every rank was stopped."
        else:
            head = f"Rank {rank} waited in one collective longer than hang_timeout, so every rank was stopped."
        detail = failure.detail if not hung else ""
        error = ProcessFailedError(failure.rank, f"{detail.rstrip()}\n{text}".strip(), failure.exitcode)
        error.args = (f"{head}\n{text}" + (f"\nIts error:\n{detail.rstrip()}" if detail.strip() else ""),)
        error.failed_at, error.diagnosis, error.collectives = failure.failed_at, kind or "hang", text
        return error

    def check(self) -> ProcessFailedError | None:
        """The first failure among the children, recorded once; None while none has failed.

        When several have failed by the time we look, the earliest is the cause: the others
        usually fail because it closed its connections ("Connection closed by peer").
        """
        with self._lock:
            return self._check()

    def _check(self) -> ProcessFailedError | None:
        if self.failure is None:
            failures = [self.failed(rank, code) for proc, rank in zip(self.procs, self.ranks)
                        if (code := _exitcode(proc)) is not None and code not in (0, PREEMPTED_EXIT_CODE)
                        and not self._ended_by_signal(code)]
            if failures:
                self.failure = self.diagnose(min(failures, key=lambda f: f.failed_at))
        return self.failure

    def wait_for_failure(self, timeout: float) -> ProcessFailedError | None:
        """After an error in this process: give a child that caused it (its socket closed first) time to be seen."""
        deadline = time.monotonic() + timeout
        while self.check() is None and self.signal_stop() is None and time.monotonic() < deadline:
            if all(_exitcode(p) is not None for p in self.procs):
                break
            time.sleep(POLL_S)
        return self.failure

    def all_done(self) -> bool:
        return all(_exitcode(p) is not None for p in self.procs)

    def _ended_by_signal(self, code: int) -> bool:
        """A child that a preemption signal from outside ended before it handled it (not one we stopped)."""
        return code in _SIGNAL_DEATHS and not os.path.exists(os.path.join(self.error_dir, STOP_MARKER))

    def signal_stop(self) -> str | None:
        """The one line of a child that stopped on a signal without the other ranks, else None."""
        for proc, rank in zip(self.procs, self.ranks):
            code = _exitcode(proc)
            if code == PREEMPTED_EXIT_CODE:
                try:
                    with open(signal_stop_file(self.error_dir, rank)) as f:
                        return f.read().strip()
                except OSError:
                    continue  # it saved with the others (the agreed stop)
            elif code is not None and self._ended_by_signal(code):
                name = signal.Signals(-code).name
                return (f"torchfleet: rank {self._global_rank(rank)} was ended by {name} before it could stop with "
                        f"the others; every process stops without saving (the last complete checkpoint stays). "
                        f"Exit code {PREEMPTED_EXIT_CODE}.")
        return None

    def stop_for_signal(self, line: str) -> Preempted:
        """Stop every child still running and say ``line`` (once); the ``Preempted`` to raise."""
        self.stop()
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        return Preempted(line)

    def preempted(self) -> bool:
        """Whether a child exited with the preemption exit code (it saved and stopped on SIGTERM/SIGUSR1)."""
        return any(_exitcode(p) == PREEMPTED_EXIT_CODE for p in self.procs)

    def wait_for_exit(self, timeout: float) -> ProcessFailedError | None:
        """After a preemption in this process: let the children exit by themselves (they saved too); a failure, if any."""
        deadline = time.monotonic() + timeout
        while not self.all_done() and self.check() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return self.check()

    def stop(self) -> None:
        """SIGTERM every child still running, then SIGKILL the ones that outlive the grace period."""
        alive = [p for p in self.procs if _exitcode(p) is None]
        if alive:
            try:
                with open(os.path.join(self.error_dir, STOP_MARKER), "w"):
                    pass
            except OSError:
                pass
        for p in alive:
            _signal(p, "terminate")
        deadline = time.monotonic() + STOP_GRACE_S
        while any(_exitcode(p) is None for p in alive) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        for p in alive:
            if _exitcode(p) is None:
                _signal(p, "kill")
        for p in alive:
            join = getattr(p, "wait", None) or p.join
            join()

    def wait(self) -> None:
        """Block until every child exits; on the first failure stop the others and raise it.

        A child that stopped on a signal without the others stops them too: ``Preempted`` (exit code 75) is raised.
        """
        while not self.all_done():
            if self.check() is not None:
                break
            line = self.signal_stop()
            if line is not None:
                raise self.stop_for_signal(line)
            time.sleep(POLL_S)
        failure = self.check()
        if failure is not None:
            self.stop()
            raise failure
        line = self.signal_stop()
        if line is not None:
            raise self.stop_for_signal(line)


def _hang_timeout(error_dir: str) -> float | None:
    try:
        with open(os.path.join(error_dir, HANG_MARKER)) as f:
            return float(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _signal(proc: Any, how: str) -> None:
    try:
        getattr(proc, how)()
    except (ProcessLookupError, OSError):
        pass


def watch_parent(parent_pid: int, on_orphaned: Callable[[], None] | None = None) -> threading.Thread:
    """In a launched child: exit when the launching process is gone, instead of waiting forever in a collective."""

    def run() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        if on_orphaned is not None:
            on_orphaned()
        sys.stderr.write(f"torchfleet: the launching process {parent_pid} is gone; rank process {os.getpid()} stops.\n")
        sys.stderr.flush()
        os._exit(1)

    thread = threading.Thread(target=run, name="torchfleet-parent-watch", daemon=True)
    thread.start()
    return thread
