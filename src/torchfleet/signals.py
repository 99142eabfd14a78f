"""Signals in a rank: recorded by the main thread's handler and, whatever the main thread does, by a thread.

Python runs signal handlers in the main thread only, between bytecodes: a rank blocked inside a
gloo/nccl collective would never run one. So ``SignalFlag`` also takes the signal's byte from a
wakeup pipe (``signal.set_wakeup_fd``), written by the C-level handler whatever the main thread does,
in a thread of its own. That thread gives the ranks a short time to reach the agreed stop after a
step (preemption.py): where they cannot (before the first step, in validation, waiting for data or
for another rank in a collective: its client's ``overdue`` policy says which), it stops this process
without a checkpoint (the last complete one stays), says why in one line, and exits with
``EXIT_CODE``; torchfleet's launchers then stop every other process of the job (``set_unagreed_stop``).
A process with one rank and no launcher unwinds instead: ``Preempted`` is raised in its main thread.

A process forked while a flag is installed (a data-loader worker) leaves the job's signals to its rank
(``_after_fork_in_child``). ``PreemptionWatch`` is a custom loop's (Fleet's) view of all this. A leaf: imports
the standard library and ``preemption`` only.
"""

from __future__ import annotations

import mmap
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from torchfleet.preemption import (
    EXIT_CODE,
    SIGNALS,
    Preempted,
    StopAgreement,
    describe_signal,
    signal_name,
    steps_overdue,
)

#: a second Ctrl-C at least this long after the first stops at once (closer ones are one keypress seen twice: a
#: terminal signals every process of the group and the spawn launcher forwards what it receives)
REPEAT_S = 1.0
#: how often the signal thread looks again once a signal arrived
_TICK_S = 0.1
#: how long a single process's main thread gets to unwind from the ``Preempted`` raised in it before it is ended
_UNWIND_S = 5.0


#: set in a launched child: the file its launcher creates before it stops the child on purpose (another
#: rank failed); a SIGTERM then ends the child at once, as it would without a handler
_stop_marker: str | None = None


def set_stop_marker(path: str | None) -> None:
    """In a launched rank: the path whose existence means a SIGTERM comes from our launcher, not a scheduler."""
    global _stop_marker
    _stop_marker = path


def _stopped_by_launcher(signum: int) -> bool:
    return _stop_marker is not None and signum == signal.SIGTERM and os.path.exists(_stop_marker)


#: how a process that stops on a signal without the other ranks tells its launcher (set by torchfleet's
#: launchers: a file the launching process reads, or, in the launching process itself, stopping the others);
#: None (torchrun, srun, one process): the line goes to stderr
_unagreed_stop: Callable[[str], None] | None = None


def set_unagreed_stop(handler: Callable[[str], None] | None) -> None:
    """Set by a launcher: what a process does with its one line before it exits on a signal without a checkpoint."""
    global _unagreed_stop
    _unagreed_stop = handler


def end_own_children() -> None:
    """SIGKILL the processes this one started through multiprocessing (data-loader workers): they go with it.

    A worker waiting in a slow ``__getitem__`` would otherwise outlive a process that ends with ``os._exit``.
    """
    import multiprocessing

    for child in multiprocessing.active_children():
        try:
            child.kill()
        except OSError:
            pass


def handled_signals() -> list[signal.Signals]:
    """``SIGNALS``, less SIGINT where this process was started with it ignored (a shell's background job, nohup):
    whoever started it so asked that Ctrl-C not reach it, as Python itself does."""
    return [sig for sig in SIGNALS if not (sig == signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN)]


#: taken by the first thread that ends this process on a signal; another (the main thread, failing on the echo of
#: the same signal) waits here for the exit
_EXITING = threading.Lock()


def exit_without_agreement(line: str) -> NoReturn:
    """End this process now with ``EXIT_CODE``: end our own children, hand ``line`` to the launcher (or stderr)."""
    _EXITING.acquire()
    try:
        end_own_children()
        handler = _unagreed_stop
        if handler is not None:
            handler(line)  # in the launching process it stops the others, says the line and exits
        else:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
    finally:
        os._exit(EXIT_CODE)


#: SIGINTs this process raised in its own main thread (``interrupt_main``, a launcher stopping rank 0), not Ctrl-C:
#: the signal thread skips that many SIGINT bytes, and the handler raises KeyboardInterrupt for the next one
_OWN_INTERRUPTS = {"bytes": 0, "raise": False}


def interrupt_main() -> None:
    """``_thread.interrupt_main()`` (KeyboardInterrupt in the main thread) that a flag does not take for Ctrl-C."""
    import _thread

    handler = signal.getsignal(signal.SIGINT)
    if isinstance(getattr(handler, "__self__", None), SignalFlag):
        _OWN_INTERRUPTS["bytes"] += 1
        _OWN_INTERRUPTS["raise"] = True
    _thread.interrupt_main()


#: the write ends of the wakeup pipes of the flags installed now: a flag installed over another does not pass
#: its bytes on to the one below (that one would act on a signal its successor is already handling)
_OUR_FDS: set[int] = set()
#: the flags installed now, outermost first
_INSTALLED: list[SignalFlag] = []


def _after_fork_in_child() -> None:
    """A process forked while a flag is installed (a data-loader worker): the signals are its parent's to act on.

    A signal sent to the whole job (scancel, a terminal's Ctrl-C) reaches the workers too: ended by it, a worker
    would fail its rank's DataLoader before the rank could save. So a worker ignores the first of a signal that
    its rank received as well (read from a byte the parent's flag shares with it), waiting a moment for the rank
    to record it; any other (the loader's own terminate, a second one) acts as the handler before ours would
    have. The wakeup pipe goes back to what it was: the worker's signals are not its parent's.
    """
    if not _INSTALLED:
        return
    outermost = _INSTALLED[0]
    global _FORKED_FROM
    _FORKED_FROM = (_INSTALLED[-1]._shared, dict(outermost._previous), set())  # the flag receiving now records
    previous_fd = outermost._previous_fd
    for flag in _INSTALLED:
        flag._previous = {}  # this process's copies restore nothing: it never installed them
    _INSTALLED.clear()
    _OUR_FDS.clear()
    try:
        signal.set_wakeup_fd(previous_fd)
        for sig in _FORKED_FROM[1]:  # the signals the parent handles (not an ignored SIGINT)
            signal.signal(sig, _forked_child_handler)
    except ValueError:  # forked from a thread that is not the main one there: nothing to change
        pass


#: in a forked child: (the byte holding the parent's first signal, the handlers before the parent's flag, the
#: signals already let pass)
_FORKED_FROM: tuple[Any, dict[int, Any], set[int]] | None = None
#: how long a forked child waits for its parent to record a signal they both received
_PARENT_RECORDS_S = 0.2


def _forked_child_handler(signum: int, frame: Any) -> None:
    assert _FORKED_FROM is not None
    shared, previous, passed = _FORKED_FROM
    deadline = time.monotonic() + _PARENT_RECORDS_S
    while shared[0] != signum and time.monotonic() < deadline:
        time.sleep(0.01)
    if shared[0] == signum and signum not in passed:
        passed.add(signum)  # the job's signal: the parent rank decides, and ends this process when it stops
        return
    handler = previous.get(signum)
    if handler is signal.SIG_IGN:
        return
    if callable(handler):
        handler(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


os.register_at_fork(after_in_child=_after_fork_in_child)

#: the policy a client gives a flag: (flag, now) -> the one line to stop with, or None to go on waiting
Overdue = Callable[["SignalFlag", float], "str | None"]


class SignalFlag:
    """Records the first SIGTERM/SIGUSR1/SIGINT that arrives while installed; restores the previous handlers after.

    Installed only from the main thread (Python delivers signals there; elsewhere ``install`` does
    nothing and returns False). The handler replaces the previous ones while installed: it does not
    call them. ``overdue`` (None: never) says when a process that received a signal stops without
    waiting for the agreed stop (see the module's docstring); ``single_process``: the run has one
    process and no launcher, so the stop is a ``Preempted`` raised in the main thread instead of an
    exit. The client calls ``begin_agreed_stop()`` before it saves at the agreed step.
    """

    def __init__(self, overdue: Overdue | None = None, single_process: bool = False) -> None:
        #: the number of the first preemption signal received, or None
        self.signum: int | None = None
        #: when it arrived (time.monotonic())
        self.received_at = 0.0
        self.overdue = overdue
        self.single_process = single_process
        self._previous: dict[int, Any] = {}
        self._previous_fd = -1
        self._write_fd = -1
        self._lock = threading.Lock()
        self._stopping = False  # the agreed stop began: nothing ends the process from the signal thread
        self._fired = False
        self._closed = False
        self._hurry = False
        self._raise: str | None = None
        self._counts: dict[int, int] = {}
        #: the first signal's number, in memory a forked child (a data-loader worker) shares
        self._shared = mmap.mmap(-1, 1)

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return False
        for sig in handled_signals():
            self._previous[sig] = signal.signal(sig, self._handle)
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._write_fd = write_fd
        _OUR_FDS.add(write_fd)
        _INSTALLED.append(self)
        self._closed = False
        threading.Thread(target=self._watch, args=(read_fd, self._previous_fd), name="torchfleet-signals",
                         daemon=True).start()
        return True

    def restore(self) -> None:
        if not self._previous:
            return
        with self._lock:
            self._closed = True
        signal.set_wakeup_fd(self._previous_fd)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
        _OUR_FDS.discard(self._write_fd)
        if self in _INSTALLED:
            _INSTALLED.remove(self)
        os.close(self._write_fd)  # the thread reads the end of the pipe and leaves
        self._write_fd = -1

    @property
    def stopping(self) -> bool:
        """Whether the agreed stop began (``begin_agreed_stop``)."""
        return self._stopping

    def begin_agreed_stop(self) -> None:
        """The ranks agreed to stop and save now: the signal thread must not end the process meanwhile."""
        with self._lock:
            fired = self._fired
            self._stopping = True
        if fired:  # too late: the thread is ending this process already
            threading.Event().wait()

    def _record(self, signum: int) -> None:
        if self.signum is None:
            self.received_at = time.monotonic()
            self.signum = signum
            self._shared[0] = signum

    def _handle(self, signum: int, frame: Any) -> None:
        if _stopped_by_launcher(signum):
            # our launcher stops this rank because another one failed: end now, as without a handler
            end_own_children()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        line, self._raise = self._raise, None
        if line is not None:  # the signal thread found the stop overdue in a single process: unwind from here
            raise Preempted(line, signal_name(self.signum or signum))
        if signum == signal.SIGINT and _OWN_INTERRUPTS["raise"]:
            _OWN_INTERRUPTS["raise"] = False
            raise KeyboardInterrupt
        # also recorded here, at once: the main thread's next check must see it (the thread may read its byte later)
        self._record(signum)

    def _watch(self, read_fd: int, previous_fd: int) -> None:
        """The signal thread: the wakeup pipe's bytes are the signals received, even while the main thread blocks."""
        done = False  # nothing more to decide; the pipe is still read until restore() closes it (a write to a pipe
        # without a reader would make Python print an error at the next signal)
        try:
            while True:
                waiting = self.signum is not None and not done
                if waiting and not select.select([read_fd], [], [], _TICK_S)[0]:
                    data = None  # no new signal: look at the deadline again
                else:
                    data = os.read(read_fd, 64)
                    if not data:
                        return  # restore() closed the pipe
                    if previous_fd >= 0 and previous_fd not in _OUR_FDS:
                        try:  # whoever set the wakeup fd before us (an event loop) still gets its bytes
                            os.write(previous_fd, data)
                        except OSError:
                            pass
                    for signum in data:
                        self._received(signum)
                if not done and self.signum is not None:
                    done = self._check_deadline()
        finally:
            os.close(read_fd)

    def _received(self, signum: int) -> None:
        if signum not in SIGNALS or self._fired:
            return
        if signum == signal.SIGINT and _OWN_INTERRUPTS["bytes"] > 0:
            _OWN_INTERRUPTS["bytes"] -= 1
            return
        if _stopped_by_launcher(signum):
            end_own_children()
            os._exit(128 + signum)  # as the handler would, had the main thread been free to run it
        count = self._counts[signum] = self._counts.get(signum, 0) + 1
        self._record(signum)
        if signum == signal.SIGINT and count > 1 and time.monotonic() - self.received_at >= REPEAT_S:
            self._hurry = True

    def _check_deadline(self) -> bool:
        """Stop this process when the client's policy says the agreed stop will not come; True when done watching."""
        overdue = self.overdue
        with self._lock:
            if self._stopping or self._closed:
                return True
            now = time.monotonic()
            line = None
            if self._hurry:
                line = (f"torchfleet: a second {describe_signal(signal.SIGINT)} stops the run at once, without a "
                        f"checkpoint (the last complete one stays). Exit code {EXIT_CODE}.")
            elif overdue is not None:
                try:
                    line = overdue(self, now)
                except Exception as exc:  # noqa: BLE001 - a broken policy must not leave the signal unheeded
                    line = (f"torchfleet: {describe_signal(self.signum or 0)} received; stopping without a "
                            f"checkpoint ({type(exc).__name__} while deciding where). Exit code {EXIT_CODE}.")
            if line is None:
                return False
            self._fired = True
        if self.single_process and _unagreed_stop is None:
            # one process, no launcher: unwind the main thread (its finally blocks and callbacks run); a real
            # signal to the main thread wakes it from a sleep or a wait, and the handler raises Preempted there
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
            self._raise = line
            signal.pthread_kill(threading.main_thread().ident, self.signum or signal.SIGTERM)
            deadline = time.monotonic() + _UNWIND_S
            while not self._closed and time.monotonic() < deadline:
                time.sleep(_TICK_S)
            if self._closed:
                return True
            os._exit(EXIT_CODE)  # the main thread is stuck where a signal cannot reach it
        exit_without_agreement(line)

    def __enter__(self) -> SignalFlag:
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()


class PreemptionWatch:
    """A custom loop's view of preemption (``Fleet.preemption_requested``), started the first time it is asked.

    Until then nothing is installed here (under torchfleet's launchers a signal then stops the job at once,
    exit code 75). Once started, the signal flag is installed and every ``optimizer.step()`` polls the
    agreement, so all ranks see the request after the same step. A rank whose steps stop coming (waiting for
    data, or for a rank that never joins the collective) stops without a checkpoint ``SIGNAL_GRACE_S`` plus
    one step's time after the signal or its last step.
    """

    __slots__ = ("agreement", "signum", "_flag")

    def __init__(self) -> None:
        self.agreement: StopAgreement | None = None
        #: the agreed signal number once the ranks agreed to stop, else None
        self.signum: int | None = None
        self._flag: SignalFlag | None = None

    def start(self, world_size: int) -> None:
        if self.agreement is None:
            self._flag = SignalFlag(self._overdue, single_process=world_size == 1)
            self._flag.install()
            self.agreement = StopAgreement(self._flag, world_size)

    def _overdue(self, flag: SignalFlag, now: float) -> str | None:
        agreement = self.agreement
        if steps_overdue(flag, agreement, now) is None:
            return None
        name = describe_signal(flag.signum or 0)
        if agreement is None or agreement.last_poll is None:
            where = "before the loop's first optimizer step"
        else:
            where = f"and no optimizer step completed for {now - agreement.last_poll:.1f} s after it"
        return (f"torchfleet: {name} received {where} (waiting for data, or for a rank that does not join a "
                "collective), so the ranks cannot agree to stop after a step: every process stops without saving "
                f"(the last complete checkpoint stays). Exit code {EXIT_CODE}.")

    def poll(self) -> None:
        """After an optimizer step, on every rank (the agreement is a collective once the run has several)."""
        if self.signum is None and self.agreement is not None:
            self.signum = self.agreement.poll()
            if self.signum is not None and self._flag is not None:
                self._flag.begin_agreed_stop()  # the loop saves and stops now: the signal thread must wait

    def close(self, completed: bool) -> None:
        """The loop ended: settle the reduction in flight (only when every rank got here), give the handlers back."""
        agreement, self.agreement = self.agreement, None
        if agreement is not None:
            if completed and self.signum is None:
                agreement.finish()
            elif not completed:
                agreement.abandon()
        if self._flag is not None:
            self._flag.restore()
            self._flag = None
