"""ScriptLauncher: rank 0 runs the user's command, local ranks 1..N-1 run the same command again.

``python train.py args``, ``python -m pkg.mod args`` and the ``torchfleet`` command are all
re-run as they were started (``sys.orig_argv``, with this interpreter), with MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, NODE_RANK and LOCAL_RANK set. Where the cluster environment already
started every rank (torchrun, srun, mpirun) or this process is itself a re-run child, nothing
is started.

The children live as long as the script: a second Trainer in the same script joins the same
process group instead of starting another set of children, because the children run that
second Trainer too. A watcher thread in the launching process stops every rank within
seconds when one of them fails, and the launching process exits non-zero naming that rank.

With ``max_restarts`` it instead replaces itself (``os.execve``) with the command it was started
with, in its original environment plus ``TF_RESTART_COUNT``: the whole script runs again, starts
the children again, and a Trainer's fit resumes from the newest checkpoint (``auto_resume``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from torchfleet import watchdog
from torchfleet.errors import ConfigurationError
from torchfleet.launchers.base import (
    ERROR_DIR_VAR,
    LAUNCHER_PID_VAR,
    Launcher,
    ProcessFailedError,
    check_port_free,
    interactive_session,
    rank_env,
    say_restart,
)
from torchfleet.launchers.script_child import lost_peer, run_as_child
from torchfleet.launchers.supervise import (
    POLL_S,
    Supervisor,
    end_with_report,
    rank_traceback,
    remove_run_folder,
    report_when_uncaught,
    say_report,
    set_own_error_dir,
)
from torchfleet.preemption import EXIT_CODE as PREEMPTED_EXIT_CODE
from torchfleet.preemption import RESTART_COUNT_VAR, Preempted, describe_signal
from torchfleet.signals import SignalFlag, end_own_children, interrupt_main, set_unagreed_stop

if TYPE_CHECKING:
    from torchfleet.environments.base import ClusterEnvironment

log = logging.getLogger(__name__)

#: how long the launching process waits for the main thread to stop after a child failed, before it exits hard
INTERRUPT_GRACE_S = 3.0
#: how long rank 0, preempted, waits for the other local ranks (which saved with it) to exit by themselves
PREEMPTED_EXIT_GRACE_S = 30.0


def command_to_rerun() -> list[str]:
    """The command that started this process, with this interpreter: script, ``-m module`` or ``-c code``."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    return [sys.executable, *argv[1:]]


class _Children:
    """The children this process started, and the thread that watches them (one set per process).

    ``original_env`` is this process's environment before the launcher exported the rank variables:
    a restart runs the command again with it (plus the restart count), as the user first ran it.
    """

    def __init__(self, supervisor: Supervisor, original_env: dict[str, str]) -> None:
        self.supervisor = supervisor
        self.original_env = original_env
        self.main_stopped = threading.Event()
        self.in_launch = 0
        self.reported = False
        self.interrupted = False  # the KeyboardInterrupt in the main thread came from us, not from Ctrl-C
        #: a thread other than the main one reports the failure and ends this process (the watchdog's, the watcher's)
        self.thread_reports = False
        #: the restarts allowed (the latest launch's max_restarts) and how many happened before this start
        self.max_restarts = 0
        self.restart = int(os.environ.get(RESTART_COUNT_VAR) or 0)
        self._decided = False  # the run was found to fail for good: said once
        self._restart_lock = threading.Lock()  # the main thread and the watcher may both see the failure
        #: rank 0's uncaught exception and when it was raised (a Fleet loop runs outside any launch)
        self.main_error: tuple[BaseException, float] | None = None
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="torchfleet-rank-watch", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)
        set_own_error_dir(supervisor.error_dir)
        watchdog.set_in_process_supervisor(self._own_hang)
        # this process is rank 0 and the launcher: a signal outside a fit (whose own flag goes first) stops every
        # rank at once, and so does one that any rank stops on without the others (_signal_stop)
        self._signal_lock = threading.Lock()
        self.stopping_on_signal = False
        self._signals = SignalFlag(self._outside_fit)
        self._signals.install()
        set_unagreed_stop(self._signal_stop)

    def _outside_fit(self, flag: SignalFlag, now: float) -> str:
        return (f"torchfleet: {describe_signal(flag.signum or 0)} received by the launching process (rank 0) "
                "outside a Trainer's fit or a Fleet loop that reads preemption_requested, so nothing can be saved: "
                f"every process stops (the last complete checkpoint stays). Exit code {PREEMPTED_EXIT_CODE}.")

    def _signal_stop(self, line: str) -> NoReturn:
        """Stop every rank now on a signal, without a checkpoint: stop the children, say ``line`` once, exit 75."""
        self._signal_lock.acquire()  # never released: a second caller waits here until the process exits
        self.stopping_on_signal = True
        self.main_stopped.set()
        self.reported = True
        end_own_children()
        self.supervisor.stop()
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        remove_run_folder(self.supervisor.error_dir)
        os._exit(PREEMPTED_EXIT_CODE)

    def _own_hang(self, watch: Any) -> None:
        """This process's own watchdog fired (rank 0 waited too long in a collective): report for every rank, exit."""
        sup = self.supervisor
        with self.lock:  # the watcher thread must not interrupt the main thread now: this thread reports
            # the main thread was told to stop, or handles an error of its own: it reports
            deferred = self.interrupted or self.reported or self.main_stopped.is_set()
            self.thread_reports = not deferred  # the main thread's error, once the others are killed, is its echo
            self.main_stopped.set()
        if deferred:  # the main thread was already told to stop and reports: leave it to do so
            threading.Event().wait()
        with sup._lock:
            failure = sup.failure or sup.diagnose(
                ProcessFailedError(sup._global_rank(0), "", watchdog.HANG_EXIT_CODE), hang_rank=sup._global_rank(0))
            sup.failure = failure
        self.restart_if_left(failure)  # does not return when restarts are left (the report is the restart line)
        self.reported = True
        say_report(failure)
        for p in sup.procs:  # at once: the main thread would report again when its collective fails
            _signal_kill(p)
        remove_run_folder(sup.error_dir)
        os._exit(watchdog.HANG_EXIT_CODE)

    def _excepthook(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if self.stopping_on_signal:  # the echo of a stop the signal thread is making: it ends this process
            threading.Event().wait()
        failed_at = time.time()
        self.main_error = (value, failed_at)
        if (not self.reported and self.restart >= self.max_restarts
                and not isinstance(value, (KeyboardInterrupt, ProcessFailedError))):
            failure = self.supervisor.wait_for_failure(timeout=1.0)
            if failure is not None and failure.failed_at <= failed_at:
                # a child failed first (a Fleet loop runs outside any launch): this rank's error ("Connection
                # closed by peer") is its echo, so the child's error is what is reported, once
                self.main_stopped.set()
                self.reported = True
                self.supervisor.stop()
                end_with_report(failure)
                return
        if (isinstance(value, Exception) and not isinstance(value, ProcessFailedError)
                and self.restart >= self.max_restarts):
            # rank 0's own error ends the run (no restart follows): said as a child's error is, frames shortened alike
            sup = self.supervisor
            end_with_report(ProcessFailedError(sup._global_rank(0), rank_traceback(value)))
            return
        self._previous_excepthook(kind, value, tb)

    def restart_if_left(self, cause: BaseException) -> None:
        """Stop every child and run the whole command again, when restarts are left (does not return then).

        ``cause`` is the child's ProcessFailedError or rank 0's own exception. Where none is left (or
        none was asked for) it returns, and the caller fails as without restarts.
        """
        sup = self.supervisor
        self._restart_lock.acquire()  # held until the exec: a second caller waits for it
        if self._decided or not say_restart(cause, sup.node_rank * sup.num_processes, self.restart,
                                            self.max_restarts, f"running the command again on all "
                                            f"{sup.num_processes} ranks"):
            self._decided = True
            self._restart_lock.release()
            return
        self.main_stopped.set()
        self.reported = True
        sup.stop()
        remove_run_folder(sup.error_dir)
        _exec_again(command_to_rerun(), dict(self.original_env, **{RESTART_COUNT_VAR: str(self.restart + 1)}))

    def _watch(self) -> None:
        sup = self.supervisor
        while sup.check() is None:
            line = sup.signal_stop()
            if line is not None:
                self._signal_stop(line)
            if sup.all_done():
                return
            time.sleep(POLL_S)
        sup.stop()
        # Stop rank 0 too, but only while it runs a launched function (it may sit in a collective that
        # will never finish); outside one, the next launch or the exit of the script reports the failure.
        while not self.main_stopped.is_set():
            if self.in_launch:
                with self.lock:
                    if self.main_stopped.is_set():
                        return
                    self.interrupted = True
                    interrupt_main()
                if not self.main_stopped.wait(INTERRUPT_GRACE_S):
                    # blocked inside C++ where the interrupt cannot land: exit with the report ourselves, unless
                    # the main thread got there meanwhile (then it reports, once)
                    with self.lock:
                        if self.main_stopped.is_set():
                            return
                        self.thread_reports = True
                        self.main_stopped.set()
                    self._report_and_exit(sup.failure)
                return
            time.sleep(POLL_S)

    def _report_and_exit(self, failure: ProcessFailedError | None) -> None:
        if failure is not None and not self.reported:
            self.restart_if_left(failure)
        if not self.reported:
            self.reported = True
            say_report(failure)
        remove_run_folder(self.supervisor.error_dir)
        hung = failure is not None and failure.diagnosis in ("hang", "desync")
        os._exit(watchdog.HANG_EXIT_CODE if hung else 1)

    def _at_exit(self) -> None:
        # the script finished in rank 0: the children finish theirs; a failure there fails the run
        self.main_stopped.set()
        try:
            if self.main_error is not None and not self.reported and self.restart < self.max_restarts:
                self._restart_after_main_error(*self.main_error)
            if self.main_error is not None and not self.reported:
                # rank 0 ended with an uncaught error outside a launch (a Fleet loop), which Python printed: the run
                # has failed, and the others would wait for rank 0 in a collective until hang_timeout. Stop them
                # (their own errors are echoes of rank 0's)
                self.reported = True
                self.supervisor.stop()
            self._wait_for_children()
        finally:
            remove_run_folder(self.supervisor.error_dir)

    def _restart_after_main_error(self, error: BaseException, failed_at: float) -> None:
        """Rank 0 ended with an uncaught exception outside a launch (a Fleet loop): restart, naming the cause."""
        if isinstance(error, KeyboardInterrupt) and not self.interrupted:
            return  # Ctrl-C: the user stops the run
        failure = self.supervisor.wait_for_failure(timeout=1.0)
        self.restart_if_left(failure if failure is not None and failure.failed_at <= failed_at else error)

    def _wait_for_children(self) -> None:
        if self.reported:
            return
        try:
            self.supervisor.wait()
        except ProcessFailedError as failure:  # the supervisor stopped the other children
            self._report_and_exit(failure)
        except Preempted:  # a child stopped on a signal: the supervisor stopped the others and said why
            remove_run_folder(self.supervisor.error_dir)
            os._exit(PREEMPTED_EXIT_CODE)


_CHILDREN: _Children | None = None


class ScriptLauncher(Launcher):
    """Start local ranks 1..N-1 by re-running this process's command; run ``fn`` here as local rank 0."""

    def __init__(self, cluster_environment: ClusterEnvironment, num_processes: int, num_nodes: int) -> None:
        self.cluster_environment = cluster_environment
        self.num_processes = num_processes
        self.num_nodes = num_nodes

    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        env = self.cluster_environment
        # the pre-flight check, as Lightning's launcher makes it: a launch that disagrees with devices x num_nodes
        # fails here, before a rank starts or waits for ranks that will never come
        env.validate_settings(self.num_processes, self.num_nodes)
        if not env.creates_processes_externally:
            if self.num_processes > 1:
                self._start_children()
            elif self.num_nodes > 1:
                # one process per node: nothing to start, but the address/port must be agreed all the same
                _export_rank_env(env, self.num_processes, self.num_nodes)
            else:
                # a run of one process: it joins its group of one inside fn; the rank variables must not outlive
                # the launch, or a later Trainer in this process (after destroy_process_group) would take the
                # process for a rank another launcher started, with a stale port
                with _exported_for_this_launch(env):
                    return self._run_here(fn, args, kwargs)
        return self._run_here(fn, args, kwargs)

    def _run_here(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        children = _CHILDREN
        if children is not None:
            children.max_restarts = self.max_restarts
            return _run_watched(children, fn, args, kwargs)
        if os.environ.get(ERROR_DIR_VAR):
            return run_as_child(fn, args, kwargs)
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:  # torchrun, srun: no launching process of ours to report a failed collective
            watchdog.explain_failure(exc)
            raise

    def _start_children(self) -> None:
        global _CHILDREN
        if interactive_session():
            raise ConfigurationError(
                "strategy='ddp' starts the other ranks by running this program's command again, but this is an "
                "interactive session (a notebook, the Python prompt or a script read from stdin), which cannot be "
                "re-run. Use strategy='ddp_notebook' (or 'ddp_fork'), or put the code in a script."
            )
        env = self.cluster_environment
        check_port_free(env)
        original_env = dict(os.environ)
        os.environ.update(_export_rank_env(env, self.num_processes, self.num_nodes))
        error_dir = tempfile.mkdtemp(prefix="torchfleet-ranks-")
        command = command_to_rerun()
        base = dict(os.environ)
        base[ERROR_DIR_VAR] = error_dir
        base[LAUNCHER_PID_VAR] = str(os.getpid())
        procs, ranks = [], []
        for local_rank in range(1, self.num_processes):
            child_env = dict(base, LOCAL_RANK=str(local_rank))
            procs.append(subprocess.Popen(command, env=child_env))
            ranks.append(local_rank)
        log.info("Started local ranks 1..%d with: %s", self.num_processes - 1, " ".join(command))
        _CHILDREN = _Children(Supervisor(procs, ranks, error_dir, env.node_rank(), self.num_processes, self_rank=0),
                              original_env)

    def kill(self, signum: int = 15) -> None:
        if _CHILDREN is not None:
            for p in _CHILDREN.supervisor.procs:
                if p.poll() is None:
                    p.send_signal(signum)


def _signal_kill(proc: Any) -> None:
    try:
        proc.kill()
    except OSError:
        pass


@contextlib.contextmanager
def _exported_for_this_launch(env: ClusterEnvironment) -> Iterator[None]:
    """Export a one-process run's rank variables for the launch, then put back what the environment had."""
    before = dict(os.environ)
    values = _export_rank_env(env, 1, 1)
    try:
        yield
    finally:
        for key in values:
            if key in before:
                os.environ[key] = before[key]
            else:
                os.environ.pop(key, None)


def _export_rank_env(env: ClusterEnvironment, num_processes: int, num_nodes: int) -> dict[str, str]:
    values = rank_env(env.main_address, env.main_port, num_processes * num_nodes, env.node_rank(), 0)
    os.environ.update(values)
    return values


def _run_watched(children: _Children, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    if children.supervisor.check() is not None:
        children.reported = True
        report_when_uncaught()
        raise children.supervisor.failure  # type: ignore[misc]
    children.in_launch += 1
    try:
        return fn(*args, **kwargs)
    except Preempted as exc:
        # every rank saved the checkpoint and stops with the same exit code: they exit by themselves; one that
        # fails instead (or hangs) is reported and stopped as always
        sup = children.supervisor
        failure = sup.wait_for_exit(PREEMPTED_EXIT_GRACE_S)
        children.main_stopped.set()
        children.reported = True
        sup.stop()
        if failure is not None:
            report_when_uncaught()
            raise failure from exc
        raise
    except BaseException as exc:
        if children.stopping_on_signal:  # an echo of the stop the signal thread is making: it ends this process
            threading.Event().wait()
        failed_at = time.time()
        with children.lock:  # from now on this handler reports: the watcher must not interrupt it (a second error)
            if children.thread_reports:  # an echo of the failure another thread of this process reports and exits on
                threading.Event().wait()
            children.main_stopped.set()
        sup = children.supervisor
        ctrl_c = isinstance(exc, KeyboardInterrupt) and not children.interrupted
        failure = None if ctrl_c else sup.wait_for_failure(timeout=_cause_wait(exc, children.interrupted))
        line = sup.signal_stop()
        if line is not None:  # this rank's error is an echo of a rank that stopped on a signal: stop them all
            children._signal_stop(line)
        children.reported = True  # the children are stopped on purpose: their exit codes are not news
        sup.stop()
        # a child that failed before this rank did is the cause; one that failed after is an echo of this error
        child_caused = failure is not None and (children.interrupted or failure.failed_at <= failed_at)
        if not ctrl_c and not _clean_exit(exc):
            children.restart_if_left(failure if child_caused else exc)  # does not return when restarts are left
        if child_caused:  # this rank's own error ("Connection closed by peer") is an echo: the report is the news
            report_when_uncaught()
            raise failure from None
        raise
    finally:
        children.in_launch -= 1


def _cause_wait(exc: BaseException, interrupted: bool) -> float:
    """How long rank 0 waits, after its own error, for a child that caused it to be seen exiting.

    An error that says a peer's connection went away is almost always the echo of a child that died first: on a
    loaded machine the child's exit can take longer than a second to be seen, so wait up to 5 s for it (the wait
    ends as soon as the child is seen). Any other error waits 1 s; none when the watcher interrupted this rank.
    """
    if interrupted:
        return 0.0
    return 5.0 if lost_peer(str(exc)) else 1.0


def _clean_exit(exc: BaseException) -> bool:
    """``sys.exit()`` / ``sys.exit(0)`` in rank 0: the script chose to end, nothing failed."""
    return isinstance(exc, SystemExit) and exc.code in (0, None)


def _exec_again(command: list[str], env: dict[str, str]) -> None:
    """Replace this process with ``command`` (rank 0 of the restarted run); its sockets are closed, not inherited.

    The process group's sockets (the rendezvous store listens in rank 0) are C++'s and may be inheritable:
    left open, the old rendezvous port would stay taken. Other descriptors (a pipe the caller passed) are kept.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    for handler in logging.getLogger().handlers + logging.getLogger("torchfleet").handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - a broken handler must not stop the restart
            pass
    try:
        descriptors = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        descriptors = []
    for fd in descriptors:
        try:
            if fd > 2 and stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.set_inheritable(fd, False)
        except OSError:
            continue
    os.execve(command[0], command, env)
