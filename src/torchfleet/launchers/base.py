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


class Launcher(ABC):
    """Starts the processes of a run and runs a function in each of them."""

    #: True when the launching process only waits and ``fn`` runs in new processes (spawn, fork):
    #: the caller then copies rank 0's results back into its own objects.
    runs_in_children: bool = False

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
        try:
            s.bind(("", port))
        except OSError as exc:
            raise ConfigurationError(
                f"MASTER_PORT={port} is already in use on this machine ({exc.strerror}), so rank 0 cannot listen "
                "there for the other ranks. Unset MASTER_PORT to let torchfleet pick a free port, or export a port "
                "that is free (another training job may be using this one)."
            ) from None
