"""Preemption: the signals a scheduler sends before it takes the machine away, and the exit code that says so.

A scheduler (SLURM with ``#SBATCH --signal=USR1@90``, Kubernetes, a spot-instance agent, ``kill``)
sends SIGTERM or SIGUSR1 some time before it kills the job; Ctrl-C sends SIGINT. While a Trainer's
``fit`` (or a Fleet loop that reads ``preemption_requested``) runs, ``SignalFlag`` records such a
signal: the handler never raises, so a signal that lands during a checkpoint save or a training step
takes effect at the next check, after the current optimizer step. A repeated SIGTERM/SIGUSR1 changes
nothing; a second Ctrl-C (a second apart or more) stops at once.

Where the ranks cannot reach that agreed stop (before the first step, in validation, waiting for data
or for another rank in a collective), ``signals.SignalFlag``'s thread stops the process without a
checkpoint after ``SIGNAL_GRACE_S`` (its client's ``overdue`` policy, e.g. ``steps_overdue``, says
when), and the launchers stop the others.

The ranks of a run receive the signal at different times, or only one of them does, so they agree
before they stop: ``StopAgreement`` reduces each rank's flag with MAX over gloo (the default group,
or a gloo group of its own under nccl), asynchronously (started at one check, read at the next), so
every rank reads the same value at the same check and stops after the same step. The ranks exchange their
flags only every few steps, as many as take ``POLL_INTERVAL_S`` (agreed in the exchange itself), so a step
in between costs nothing but a clock reading.

The run then writes one checkpoint and raises ``Preempted``, a ``SystemExit`` with the exit code
``EXIT_CODE`` (75, ``EX_TEMPFAIL``: "try again later"); the launchers pass that code on instead of
reporting a failure. This module is a leaf: it imports only the standard library and torch.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Protocol

from torchfleet.utilities.exceptions import SIGTERMException

#: the exit code of a run stopped by a preemption signal after saving its checkpoint (EX_TEMPFAIL)
EXIT_CODE = 75

#: the signals that ask a run to save and stop: SIGTERM (what schedulers and ``kill`` send), SIGUSR1
#: (what SLURM sends ``--signal=USR1@<seconds>`` before the end of a job's time) and SIGINT (Ctrl-C)
SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

#: how long a rank that received a signal goes on where the ranks cannot agree to stop after a step (before the
#: first step, validation, a data-loader wait, a collective another rank never joins) before it stops without a
#: checkpoint; in the training steps it gets this much more than one step takes
SIGNAL_GRACE_S = 2.0

#: set by torchfleet's own launchers in the ranks they start again after a failure (``max_restarts``)
RESTART_COUNT_VAR = "TF_RESTART_COUNT"

#: environment variables that say this process is a restart of an earlier run: ours, torchrun's, SLURM's
RESTART_VARIABLES = (RESTART_COUNT_VAR, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")


class SignalRecord(Protocol):
    """What the agreement reads of a signal flag (``signals.SignalFlag``, which imports this module)."""

    @property
    def signum(self) -> int | None:
        """The signal received, None before one."""

    @property
    def received_at(self) -> float:
        """When it was received (``time.monotonic()``)."""


class Preempted(SIGTERMException):
    """The run was asked to stop by a preemption signal, saved its checkpoint, and stopped.

    A ``SystemExit`` (Lightning's ``SIGTERMException``): uncaught, the process exits with ``EXIT_CODE`` (75) and prints nothing more,
    so a job script or scheduler can tell "try again later" from a failure. ``signal`` is the
    signal's name, ``checkpoint`` the path of the checkpoint written (None where none was).
    """

    #: the process exit code (``torchfleet.preemption.EXIT_CODE``)
    exit_code = EXIT_CODE

    def __init__(self, message: str, signal_name: str | None = None, checkpoint: str | None = None) -> None:
        super().__init__(EXIT_CODE)
        self.message = message
        self.signal = signal_name
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> Any:
        return (type(self), (self.message, self.signal, self.checkpoint))


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_signal(signum: int) -> str:
    """The signal's name for a message; Ctrl-C's says what Python users know it as."""
    name = signal_name(signum)
    return f"{name} (Ctrl-C, KeyboardInterrupt)" if signum == signal.SIGINT else name


def restart_count() -> int:
    """How many times this run was started again: the largest of torchfleet's, torchrun's and SLURM's counts (0)."""
    count = 0
    for name in RESTART_VARIABLES:
        try:
            count = max(count, int(os.environ.get(name, "0") or "0"))
        except ValueError:
            continue
    return count


def is_restart() -> bool:
    """Whether this process is a restart of an earlier run (torchfleet's, torchrun's or SLURM's count above 0)."""
    return restart_count() > 0


#: the group the flags are reduced on, per default process group: the default group itself when it is gloo
#: (measured: a 1-element async reduction there costs nothing per step on 2 CPU cores, while one on a second
#: gloo group costs ~0.5 ms: its own threads wake up every step); a gloo group of its own under nccl (the
#: flag is a CPU tensor: nccl would need a device stream and a device sync to read it). Created once.
_GROUPS: dict[int, Any] = {}


def _agreement_group() -> Any:
    import torch.distributed as dist

    world = dist.group.WORLD
    group = _GROUPS.get(id(world))
    if group is None:
        group = world if dist.get_backend(world) == "gloo" else dist.new_group(backend="gloo")
        _GROUPS.clear()  # a group of an earlier default group is of no use any more
        _GROUPS[id(world)] = group
    return group


#: the wall time aimed for between two exchanges of the ranks' flags: each rank proposes as many steps as take this
#: long (measured), the ranks take the fewest proposed; a stop then comes within this time plus one step of a signal
POLL_INTERVAL_S = 0.25

#: the most steps between two exchanges, however short a step is
MAX_STEPS_BETWEEN_POLLS = 1000


class StopAgreement:
    """Whether any rank received a preemption signal, known by every rank at the same check.

    ``poll()`` is called by every rank at the same points (the end of each optimizer step). With one
    process it reads the flag. With several, the ranks exchange their flags only every ``every`` steps
    (one small asynchronous all_reduce: started at a polling step, read at the next poll), so a step in
    between costs a clock reading. The buffer carries [signal, -proposed steps]; MAX over the ranks gives
    the signal of any rank and the fewest steps any rank proposed (``POLL_INTERVAL_S`` of its own measured
    steps, at most ``MAX_STEPS_BETWEEN_POLLS``), so every rank reads the same values after the same step
    and polls at the same step numbers. A signal is therefore acted on at most ``every`` + 1 steps after it
    arrived (one ``POLL_INTERVAL_S`` plus a step). ``poll(force=True)`` (the epoch's last step) exchanges
    and reads at once. ``last_poll`` and ``interval`` tell the signal thread whether the steps still come;
    ``reductions`` counts the exchanges started.
    """

    __slots__ = ("flag", "_group", "_work", "_buf", "_distributed", "last_poll", "_previous", "_before", "every",
                 "reductions", "_steps", "_next", "_started", "_started_at")

    def __init__(self, flag: SignalRecord, world_size: int) -> None:
        self.flag = flag
        self._distributed = world_size > 1
        self._group: Any = None
        self._work: Any = None
        self._buf: Any = None
        #: time.monotonic() of the last poll (None before the first), and of the two before it
        self.last_poll: float | None = None
        self._previous: float | None = None
        self._before: float | None = None
        #: the agreed number of steps between two exchanges (1 until the ranks agreed on a measured one)
        self.every = 1
        #: how many exchanges (all_reduces) this agreement started
        self.reductions = 0
        #: polls so far; the poll at which the next exchange starts; the poll and the time of the last one started
        self._steps = 0
        self._next = 1
        self._started = 0
        self._started_at: float | None = None

    @property
    def interval(self) -> float:
        """The time a step takes: the shorter of the last two between polls (one that held a validation does not
        stretch the next wait); 0 before two polls."""
        last, previous, before = self.last_poll, self._previous, self._before
        if last is None or previous is None:
            return 0.0
        return last - previous if before is None else min(last - previous, previous - before)

    def poll(self, force: bool = False) -> int | None:
        """The agreed signal number when the ranks are to stop now; None to go on.

        ``force``: exchange the flags now and wait for the result (every rank passes the same value)."""
        # the times of the last three polls (the signal thread reads the step time from them)
        now = _monotonic()
        self._before, self._previous, self.last_poll = self._previous, self.last_poll, now
        if not self._distributed:
            return self.flag.signum
        self._steps += 1
        if self._work is not None and (agreed := self._read()):
            return agreed
        if self._steps < self._next and not force:
            return None
        self._start(now)
        return self._read() if force else None

    def _start(self, now: float) -> None:
        """Start the exchange: this rank's flag and the steps it proposes until the next one."""
        import torch
        import torch.distributed as dist

        if self._group is None:
            self._group = _agreement_group()
            self._buf = torch.zeros(2, dtype=torch.int32)
        steps, since = self._steps - self._started, self._started_at
        propose = 1
        if since is not None and steps > 0:
            per_step = (now - since) / steps
            propose = MAX_STEPS_BETWEEN_POLLS if per_step * MAX_STEPS_BETWEEN_POLLS <= POLL_INTERVAL_S else max(
                1, int(POLL_INTERVAL_S / per_step))
        self._buf[0] = self.flag.signum or 0
        self._buf[1] = -propose
        self._started, self._started_at, self._next = self._steps, now, 1 << 62  # the next is known once read
        self.reductions += 1
        self._work = dist.all_reduce(self._buf, op=dist.ReduceOp.MAX, group=self._group, async_op=True)

    def _read(self) -> int | None:
        """Wait for the exchange in flight; the agreed signal, else None (and the agreed schedule is set)."""
        work, self._work = self._work, None
        work.wait()
        agreed = int(self._buf[0].item())
        self.every = -int(self._buf[1].item())
        self._next = self._started + self.every
        return agreed or None

    def finish(self) -> int | None:
        """At the end of the loop on every rank: wait for the reduction in flight; the signal it agreed on, if any."""
        return self._read() if self._work is not None else None

    def abandon(self) -> None:
        """After an error: a reduction may be left unmatched; the next run makes a new group."""
        if self._work is not None:
            self._work = None
            _GROUPS.clear()


_monotonic = time.monotonic


def steps_overdue(flag: SignalRecord, agreement: StopAgreement | None, now: float, stepping: bool = True) -> float | None:
    """How long past its grace a rank with a signal is (None: not yet), judged by whether its steps still come.

    ``stepping``: the rank is in the training steps, where the agreed stop comes within ``POLL_INTERVAL_S`` plus
    a step (the polls between two exchanges still record their times); it then has ``SIGNAL_GRACE_S`` plus one
    step's time since the later of the signal and its last poll: the grace runs only once the steps stop coming. Elsewhere
    (before the first step, in validation) it has ``SIGNAL_GRACE_S`` from the signal.
    """
    last = agreement.last_poll if agreement is not None else None
    if stepping and last is not None:
        late = now - max(flag.received_at, last) - SIGNAL_GRACE_S - agreement.interval  # type: ignore[union-attr]
    else:
        late = now - flag.received_at - SIGNAL_GRACE_S
    return late if late > 0 else None
