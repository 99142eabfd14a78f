"""Preemption: the signals a scheduler sends before it takes the machine away, and the exit code that says so.

A scheduler (SLURM with ``#SBATCH --signal=USR1@90``, Kubernetes, a spot-instance agent, ``kill``)
sends SIGTERM or SIGUSR1 some time before it kills the job. While a Trainer's ``fit`` (or a Fleet)
runs, ``SignalFlag`` records such a signal and nothing else: the handler never raises, so a signal
that lands during a checkpoint save, a validation or the sanity check takes effect at the next
check, after the current optimizer step. A second signal changes nothing.

The ranks of a run receive the signal at different times, or only one of them does, so they agree
before they stop: ``StopAgreement`` reduces each rank's flag with MAX over gloo (the default group,
or a gloo group of its own under nccl), asynchronously (started at one check, read at the next), so
every rank reads the same value at the same check and stops after the same step, at the cost of one
small non-blocking message per step.

The run then writes one checkpoint and raises ``Preempted``, a ``SystemExit`` with the exit code
``EXIT_CODE`` (75, ``EX_TEMPFAIL``: "try again later"); the launchers pass that code on instead of
reporting a failure. This module is a leaf: it imports only the standard library and torch.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

#: the exit code of a run stopped by a preemption signal after saving its checkpoint (EX_TEMPFAIL)
EXIT_CODE = 75

#: the signals that ask a run to save and stop: SIGTERM (what schedulers and ``kill`` send) and SIGUSR1
#: (what SLURM sends ``--signal=USR1@<seconds>`` before the end of a job's time)
SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)

#: set by torchfleet's own launchers in the ranks they start again after a failure (``max_restarts``)
RESTART_COUNT_VAR = "TF_RESTART_COUNT"

#: environment variables that say this process is a restart of an earlier run: ours, torchrun's, SLURM's
RESTART_VARIABLES = (RESTART_COUNT_VAR, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")


class Preempted(SystemExit):
    """The run was asked to stop by a preemption signal, saved its checkpoint, and stopped.

    A ``SystemExit``: uncaught, the process exits with ``EXIT_CODE`` (75) and prints nothing more,
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


#: set in a launched child: the file its launcher creates before it stops the child on purpose (another
#: rank failed); a SIGTERM then ends the child at once, as it would without a handler
_stop_marker: str | None = None


def set_stop_marker(path: str | None) -> None:
    """In a launched rank: the path whose existence means a SIGTERM comes from our launcher, not a scheduler."""
    global _stop_marker
    _stop_marker = path


class SignalFlag:
    """Records the first SIGTERM/SIGUSR1 that arrives while installed; restores the previous handlers after.

    Installed only from the main thread (Python delivers signals there; elsewhere ``install`` does
    nothing and returns False). The handler replaces the previous ones while installed: it does not
    call them.
    """

    def __init__(self) -> None:
        #: the number of the first preemption signal received, or None
        self.signum: int | None = None
        #: when it arrived (time.monotonic())
        self.received_at = 0.0
        self._previous: dict[int, Any] = {}

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return False
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if _stop_marker is not None and signum == signal.SIGTERM and os.path.exists(_stop_marker):
            # our launcher stops this rank because another one failed: end now, as without a handler
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.signum is None:
            self.signum = signum
            self.received_at = time.monotonic()

    def __enter__(self) -> SignalFlag:
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()


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


class StopAgreement:
    """Whether any rank received a preemption signal, known by every rank at the same check.

    ``poll()`` is called by every rank at the same points (the end of each optimizer step). With one
    process it reads the flag. With several, it waits for the reduction started at the previous poll
    and starts the next one with this rank's flag: all ranks read the same MAX, one step after the
    earliest signal, and no rank blocks on a slow one in between.
    """

    __slots__ = ("flag", "_group", "_work", "_buf", "_distributed")

    def __init__(self, flag: SignalFlag, world_size: int) -> None:
        self.flag = flag
        self._distributed = world_size > 1
        self._group: Any = None
        self._work: Any = None
        self._buf: Any = None

    def poll(self) -> int | None:
        """The agreed signal number when the ranks are to stop now; None to go on."""
        if not self._distributed:
            return self.flag.signum
        import torch
        import torch.distributed as dist

        work = self._work
        if work is not None:
            work.wait()
            self._work = None
            agreed = int(self._buf.item())
            if agreed:
                return agreed
        elif self._group is None:
            self._group = _agreement_group()
            self._buf = torch.zeros(1, dtype=torch.int32)
        self._buf.fill_(self.flag.signum or 0)
        self._work = dist.all_reduce(self._buf, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return None

    def finish(self) -> int | None:
        """At the end of the loop on every rank: wait for the reduction in flight; the signal it agreed on, if any."""
        work, self._work = self._work, None
        if work is None:
            return None
        work.wait()
        return int(self._buf.item()) or None

    def abandon(self) -> None:
        """After an error: a reduction may be left unmatched; the next run makes a new group."""
        if self._work is not None:
            self._work = None
            _GROUPS.clear()


class PreemptionWatch:
    """A custom loop's view of preemption (``Fleet.preemption_requested``), started the first time it is asked.

    Until then nothing is installed: a Fleet that never asks keeps the default SIGTERM behaviour (the
    process ends). Once started, the signal flag is installed and every ``optimizer.step()`` polls the
    agreement, so all ranks see the request after the same step.
    """

    __slots__ = ("agreement", "signum", "_flag")

    def __init__(self) -> None:
        self.agreement: StopAgreement | None = None
        #: the agreed signal number once the ranks agreed to stop, else None
        self.signum: int | None = None
        self._flag: SignalFlag | None = None

    def start(self, world_size: int) -> None:
        if self.agreement is None:
            self._flag = SignalFlag()
            self._flag.install()
            self.agreement = StopAgreement(self._flag, world_size)

    def poll(self) -> None:
        """After an optimizer step, on every rank (the agreement is a collective once the run has several)."""
        if self.signum is None and self.agreement is not None:
            self.signum = self.agreement.poll()

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
