"""The Launcher interface and the error a launcher raises when a rank fails."""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from torchfleet.errors import ConfigurationError, TorchfleetError

#: how long the other ranks get to stop on SIGTERM before they are killed
STOP_GRACE_S = 2.0


class ProcessFailedError(TorchfleetError, RuntimeError):
    """A rank of a multi-process run raised or was killed; the other ranks were stopped."""

    def __init__(self, rank: int, detail: str, exitcode: int | None = None) -> None:
        self.rank, self.detail, self.exitcode = rank, detail, exitcode
        #: when the rank failed (time.time()), where known; orders simultaneous failures
        self.failed_at = 0.0
        #: "hang" or "desync" when the watchdog's collectives report explains the failure, else ""
        self.diagnosis = ""
        #: that report: every rank's current or last collective (number, name, call site), stacks
        self.collectives = ""
        super().__init__(
            f"Rank {rank} failed{describe_exit(exitcode)}, so the other ranks were stopped. Its error:\n{detail.rstrip()}"
        )


def describe_exit(exitcode: int | None) -> str:
    """' (exit code 3)' or ' (killed by SIGKILL)' for a process's exit code; '' when unknown."""
    if exitcode is None:
        return ""
    if exitcode < 0:
        try:
            return f" (killed by {signal.Signals(-exitcode).name})"
        except ValueError:
            return f" (killed by signal {-exitcode})"
    return f" (exit code {exitcode})"


#: set by ``torchfleet run`` in the processes it starts: it, not the script, owns their restarts
RUN_RESTARTS_VAR = "TF_RUN_STARTED"
#: environment variables through which a launched child learns where to report and whom to watch (supervise.py)
ERROR_DIR_VAR = "TF_ERROR_DIR"
LAUNCHER_PID_VAR = "TF_LAUNCHER_PID"


def check_max_restarts(value: Any) -> int:
    """``value`` if it is a valid ``max_restarts`` (an int >= 0), else a ConfigurationError saying what is accepted."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(
            f"max_restarts={value!r} is not valid: give an int >= 0, the number of times every rank is started "
            "again (resuming from the newest checkpoint) after a rank fails; 0, the default, fails at the first "
            "failure."
        )
    return value


def failure_summary(error: BaseException, rank: int) -> str:
    """One line naming the rank that failed and why: its exit code or signal, and its exception's last line."""
    if isinstance(error, ProcessFailedError):
        lines = [line.strip() for line in error.detail.splitlines() if line.strip()]
        traceback = bool(lines) and lines[0].startswith("Traceback")
        reason = f": {lines[-1]}" if traceback else ""
        diagnosis = getattr(error, "diagnosis", None)  # the watchdog's finding: the report says the rest
        if diagnosis:
            reason = f": {'a desync' if diagnosis == 'desync' else 'a hang'} between the ranks' collectives"
        return f"rank {error.rank} failed{describe_exit(error.exitcode)}{reason}"
    message = str(error).strip().splitlines()
    return f"rank {rank} raised {type(error).__name__}" + (f": {message[0]}" if message else "")


def say_restart(cause: BaseException, rank: int, done: int, max_restarts: int, what: str) -> bool:
    """Whether to start the ranks again after ``cause`` (``done`` restarts so far), said in one line on stderr.

    ``rank`` is the failing rank when ``cause`` is not a ProcessFailedError (the launching rank's own error);
    ``what`` says what a restart does. Without ``max_restarts`` nothing is written: the error says it all.
    """
    import sys

    if not max_restarts:
        return False
    summary = failure_summary(cause, rank)
    report = getattr(cause, "collectives", None)
    if report:  # what each rank was doing, before the line that says what happens next
        sys.stderr.write(f"{report}\n")
    if done >= max_restarts:
        sys.stderr.write(f"torchfleet: {summary}; all {max_restarts} restart(s) used, so the run fails.\n")
    else:
        sys.stderr.write(f"torchfleet: {summary}; {what} (restart {done + 1} of {max_restarts}).\n")
    sys.stderr.flush()
    return done < max_restarts


def check_restarts_apply(max_restarts: int, env: Any, num_processes: int, num_nodes: int) -> None:
    """Refuse or warn where ``max_restarts`` cannot be honoured by torchfleet's own launchers."""
    import logging
    import os

    if not max_restarts:
        return
    from torchfleet.utilities import rank_zero_only

    log = logging.getLogger("torchfleet")
    if env.creates_processes_externally:
        if rank_zero_only.rank != 0:  # said once, by global rank 0
            return
        if os.environ.get(RUN_RESTARTS_VAR):
            log.warning("max_restarts=%d has no effect here: `torchfleet run` started the processes, so it is what "
                        "restarts them: give it --max-restarts %d.", max_restarts, max_restarts)
        elif not os.environ.get(ERROR_DIR_VAR):  # not a rank our own launcher started: torchrun, srun, mpirun
            log.warning(
                "max_restarts=%d has no effect here: %s started the ranks, so it is what restarts them (torchrun "
                "--max-restarts=N, with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 under gloo; SLURM's requeue). A "
                "restarted run resumes from its newest checkpoint all the same.", max_restarts, type(env).__name__)
        return
    if num_nodes > 1:
        raise ConfigurationError(
            f"max_restarts={max_restarts} with num_nodes={num_nodes}: torchfleet's own launcher restarts the ranks of "
            "one machine only, and the machines would each restart on their own. Start the run with torchrun "
            "--max-restarts (every machine restarts together) or a scheduler that requeues it, or use max_restarts "
            "on one machine."
        )
    if num_processes == 1:
        log.warning("max_restarts=%d has no effect with a single process: no launching process watches it and "
                    "starts it again.", max_restarts)


class Launcher(ABC):
    """Starts the processes of a run and runs a function in each of them."""

    #: True when the launching process only waits and ``fn`` runs in new processes (spawn, fork):
    #: the caller then copies rank 0's results back into its own objects.
    runs_in_children: bool = False
    #: how many times every rank is started again after a failure (``max_restarts``; 0: fail at once)
    max_restarts: int = 0

    @property
    def is_interactive_compatible(self) -> bool:
        """Whether it can start its ranks from a notebook or the Python prompt (Lightning's launcher property)."""
        return False

    @abstractmethod
    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` in every rank; return rank 0's result."""

    def kill(self, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` to the processes this launcher started."""


def interactive_session() -> bool:
    """True in a notebook, an interactive interpreter, or a script read from stdin (none can be re-run)."""
    import sys

    if getattr(sys, "ps1", None) is not None or sys.flags.interactive:
        return True
    if "ipykernel" in sys.modules or ("IPython" in sys.modules and _in_ipython()):
        return True
    return not sys.argv or sys.argv[0] in ("", "-")


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython  # type: ignore[import-not-found]
    except ImportError:
        return False
    return get_ipython() is not None


def rank_env(main_address: str, main_port: int, world_size: int, node_rank: int, local_rank: int) -> dict[str, str]:
    """The variables a process started by our launchers reads to find its place in the run (RANK is not among
    them: LocalEnvironment computes it, and an exported RANK would make the process look torchrun-started)."""
    return {
        "MASTER_ADDR": main_address,
        "MASTER_PORT": str(main_port),
        "WORLD_SIZE": str(world_size),
        "NODE_RANK": str(node_rank),
        "LOCAL_RANK": str(local_rank),
    }


def check_port_free(env: Any) -> None:
    """On the main node, refuse a MASTER_PORT that something already listens on: the run would fail late or hang."""
    import os
    import socket

    if env.node_rank() != 0 or not os.environ.get("MASTER_PORT"):
        return  # a port we choose ourselves was free a moment ago
    port = env.main_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # a port whose last connections linger in TIME_WAIT (a restarted run's) is free; a listener is not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as exc:
            raise ConfigurationError(
                f"MASTER_PORT={port} is already in use on this machine ({exc.strerror}), so rank 0 cannot listen "
                "there for the other ranks. Unset MASTER_PORT to let torchfleet pick a free port, or export a port "
                "that is free (another training job may be using this one)."
            ) from None
