"""ProcessLauncher: run a function in N new processes with spawn, fork or forkserver (ddp_spawn, ddp_fork).

The launching process only waits: it starts local ranks 0..N-1, watches them (the first that
fails stops the others and is reported with its traceback), and returns rank 0's result, which
rank 0 writes to a file when it finishes. ``torch.multiprocessing``'s context is used so that
tensors crossing the boundary go through shared memory.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from torchfleet.errors import ConfigurationError
from torchfleet.launchers.base import (
    ERROR_DIR_VAR,
    LAUNCHER_PID_VAR,
    Launcher,
    ProcessFailedError,
    check_port_free,
    rank_env,
    say_restart,
)
from torchfleet.launchers.pickling import find_unpicklable
from torchfleet.launchers.supervise import (
    Supervisor,
    exit_if_peer_stopped_on_signal,
    mark_launched_child,
    remove_run_folder,
    report_when_uncaught,
    watch_parent,
    write_error,
)
from torchfleet.preemption import RESTART_COUNT_VAR, Preempted
from torchfleet.signals import handled_signals

if TYPE_CHECKING:
    from torchfleet.environments.base import ClusterEnvironment

log = logging.getLogger(__name__)

START_METHODS = ("spawn", "fork", "forkserver")
_RESULT_FILE = "result.pt"
_PAYLOAD_FILE = "payload.pkl"
#: rank 0's Preempted (message, signal, checkpoint), for the launching process to raise
_PREEMPTED_FILE = "preempted.json"


class _PayloadFile:
    """Where the pickled (function, args, kwargs) of a spawn launch wait for the children."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> Any:
        with open(self.path, "rb") as f:
            return pickle.load(f)


class ProcessLauncher(Launcher):
    """Run ``fn`` in ``num_processes`` new processes started with ``start_method``; return rank 0's result."""

    runs_in_children = True

    def __init__(self, cluster_environment: ClusterEnvironment, num_processes: int, num_nodes: int,
                 start_method: str = "spawn") -> None:
        if start_method not in START_METHODS:
            raise ConfigurationError(
                f"start_method={start_method!r} is not a process start method. Accepted: 'popen' (re-run the "
                f"script, strategy='ddp'), {', '.join(map(repr, START_METHODS))}."
            )
        import multiprocessing

        if start_method not in multiprocessing.get_all_start_methods():
            raise ConfigurationError(
                f"start_method={start_method!r} is not available on this platform (it offers "
                f"{', '.join(map(repr, multiprocessing.get_all_start_methods()))}). Use strategy='ddp_spawn' or 'ddp'."
            )
        self.cluster_environment = cluster_environment
        self.num_processes = num_processes
        self.num_nodes = num_nodes
        self.start_method = start_method
        self._supervisor: Supervisor | None = None

    @property
    def is_interactive_compatible(self) -> bool:
        """Fork starts the ranks from the running interpreter; spawn re-imports ``__main__``, which a notebook lacks."""
        return self.start_method == "fork"

    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        env = self.cluster_environment
        if env.creates_processes_externally:
            raise ConfigurationError(
                f"start_method={self.start_method!r} starts the ranks itself, but this process was already started "
                f"as one rank by {type(env).__name__} (torchrun, srun or mpirun). Use strategy='ddp' there: it "
                "joins the ranks the launcher started."
            )
        env.validate_settings(self.num_processes, self.num_nodes)  # the pre-flight check, before a rank starts
        payload = self._check_can_start(fn, args, kwargs)
        check_port_free(env)
        restart = 0
        while True:
            try:
                return self._launch_once(payload, restart)
            except ProcessFailedError as failure:
                # the new ranks start from what was pickled (spawn) or from this process's unchanged state (fork),
                # with TF_RESTART_COUNT set: a Trainer's fit resumes from the newest checkpoint (auto_resume)
                if not say_restart(failure, failure.rank, restart, self.max_restarts,
                                   f"starting all {self.num_processes} ranks again"):
                    report_when_uncaught()
                    raise
                restart += 1

    def _launch_once(self, payload: Any, restart: int) -> Any:
        """Start the ranks once, wait for them; rank 0's result, or the first failure raised."""
        env = self.cluster_environment
        import torch.multiprocessing as mp

        from torchfleet.environments.local import find_free_port

        # a fresh port per launch unless the user fixed one: a second fit must not meet the first's socket
        port = int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else find_free_port()
        variables = rank_env(env.main_address, port, self.num_processes * self.num_nodes, env.node_rank(), 0)
        if restart:
            variables[RESTART_COUNT_VAR] = str(restart)
        work = tempfile.mkdtemp(prefix="torchfleet-ranks-")
        if isinstance(payload, bytes):
            # through a file, not the start pipe: a pipe holds 64 KB, so each start would block until that
            # child had imported torch and read its copy, and the ranks would start one after the other
            path = os.path.join(work, _PAYLOAD_FILE)
            with open(path, "wb") as f:
                f.write(payload)
            payload = _PayloadFile(path)
        ctx = mp.get_context(self.start_method)
        # a spawned rank starts with fresh generators: give it this process's (seed_everything's), as a fork has
        rng = _rng_states() if self.start_method != "fork" else None
        procs = []
        try:
            for local_rank in range(self.num_processes):
                proc = ctx.Process(
                    target=_child_main,
                    args=(local_rank, variables, work, os.getpid(), payload, rng),
                    name=f"torchfleet-rank-{local_rank}",
                )
                proc.start()
                procs.append(proc)
            self._supervisor = Supervisor(procs, list(range(len(procs))), work, env.node_rank(), self.num_processes)
            forwarding = _forward_signals(procs)
            try:
                self._supervisor.wait()
            except BaseException:
                self._supervisor.stop()
                raise
            finally:
                forwarding()
            if self._supervisor.preempted():
                raise _preempted(work)
            result_path = os.path.join(work, _RESULT_FILE)
            if env.node_rank() != 0 or not os.path.exists(result_path):
                return None
            return torch.load(result_path, weights_only=False)
        finally:
            remove_run_folder(work)
            self._supervisor = None

    def _check_can_start(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """What the children receive: the objects themselves (fork) or their pickled bytes (spawn, forkserver).

        Pickling here, with the standard pickler, gives every rank its own copy of the tensors;
        multiprocessing's pickler would share their storage between the ranks, and each rank's
        optimizer would then step the same parameters.
        """
        if self.start_method == "fork":
            # is_initialized() only: is_available() would itself start the CUDA driver and spoil the fork
            if torch.cuda.is_initialized():
                raise ConfigurationError(
                    "strategy='ddp_fork' (or 'ddp_notebook') cannot start its processes: CUDA was already "
                    "initialised in this process (something ran on the GPU, or called torch.cuda functions that "
                    "create a context), and CUDA does not survive a fork. Restart the notebook/interpreter and "
                    "keep GPU work out of it before trainer.fit, or use strategy='ddp_spawn', or 'ddp' in a script."
                )
            threads = autograd_device_threads()
            if threads:
                raise ConfigurationError(
                    "strategy='ddp_fork' (or 'ddp_notebook') cannot start its processes: a backward pass already ran "
                    f"in this process on a machine with an accelerator, so autograd started its device threads "
                    f"({', '.join(threads)}), and a forked process cannot run backward after that (PyTorch refuses "
                    "it in every rank). This happens even with accelerator='cpu'. Restart the notebook/interpreter "
                    "and call trainer.fit before any other training in it, or use strategy='ddp_spawn', or 'ddp' "
                    "in a script."
                )
            return (fn, args, kwargs)
        try:
            return pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - find out which part, and say so
            pass
        from torch import nn

        parts = [("function", fn), *((f"argument {i}", a) for i, a in enumerate(args)),
                 *((f"argument {k!r}", v) for k, v in kwargs.items())]
        # the model first: the Trainer holds it too, but "model.augment" says more than "trainer.module.augment"
        parts.sort(key=lambda part: not isinstance(part[1], nn.Module))
        for name, obj in parts:
            found = find_unpicklable(obj, _name_of(obj, name))
            if found is not None:
                path, error = found
                raise ConfigurationError(
                    f"strategy='ddp_spawn' sends the model, the data and the Trainer to new processes by pickling "
                    f"them, and {path} cannot be pickled ({type(error).__name__}: {error}). Make it picklable (a "
                    "module-level function or class instead of a lambda or local function, no open files or "
                    "locks), or use strategy='ddp' (re-runs the script) or 'ddp_fork' (no pickling), which do "
                    "not need it."
                )
        raise ConfigurationError(
            "strategy='ddp_spawn' could not pickle what it sends to the new processes, though each part pickles on "
            "its own. Use strategy='ddp' or 'ddp_fork', which do not pickle."
        )

    def kill(self, signum: int = 15) -> None:
        if self._supervisor is not None:
            for p in self._supervisor.procs:
                if p.exitcode is None and p.pid is not None:
                    os.kill(p.pid, signum)


#: the name PyTorch gives autograd's per-device worker threads, followed by the device index
_AUTOGRAD_THREAD_PREFIX = "pt_autograd_"


def autograd_device_threads() -> list[str]:
    """Names of autograd's device worker threads running in this process (Linux; [] where it cannot tell).

    PyTorch starts one thread per accelerator device at the first backward pass when the machine has
    one, whatever device that backward ran on, and marks every process forked afterwards as unable to
    run backward. Those threads are named ``pt_autograd_<device>``, which is how we see them.
    """
    names = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return names
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended while we looked
            continue
        if name.startswith(_AUTOGRAD_THREAD_PREFIX):
            names.append(name)
    return sorted(names)



def _name_of(obj: Any, default: str) -> str:
    from torch import nn

    if isinstance(obj, nn.Module):
        return "model"
    return type(obj).__name__.lower() if type(obj).__name__ in ("Trainer", "Fleet") else default


def _forward_signals(procs: list[Any]) -> Callable[[], None]:
    """While the launching process waits: pass SIGTERM/SIGUSR1/SIGINT on to the ranks (they save and stop together).

    Returns the function that puts the previous handlers back. Only in the main thread (elsewhere nothing).
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def forward(signum: int, frame: Any) -> None:
        for p in procs:
            if p.exitcode is None and p.pid is not None:
                try:
                    os.kill(p.pid, signum)
                except ProcessLookupError:
                    pass

    previous = {sig: signal.signal(sig, forward) for sig in handled_signals()}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    return restore


def _preempted(work: str) -> Preempted:
    try:
        with open(os.path.join(work, _PREEMPTED_FILE)) as f:
            saved = json.load(f)
        return Preempted(saved["message"], saved["signal"], saved["checkpoint"])
    except (OSError, ValueError, KeyError):
        return Preempted("The ranks were preempted (SIGTERM/SIGUSR1) and stopped after saving a checkpoint.")


def _rng_states() -> dict[str, Any]:
    import random

    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np

        states["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    import random

    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "numpy" in states:
        import numpy as np

        np.random.set_state(states["numpy"])


def _child_main(local_rank: int, variables: dict[str, str], work: str, parent_pid: int, payload: Any,
                rng: dict[str, Any] | None = None) -> None:
    for sig in handled_signals():  # a forked rank inherits the launching process's forwarding handler
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)  # and a wakeup pipe whose reader stayed in the launching process
    mark_launched_child(work, local_rank)
    if rng is not None:
        _set_rng_states(rng)
    os.environ.update(variables)
    os.environ["LOCAL_RANK"] = str(local_rank)
    os.environ[ERROR_DIR_VAR] = work
    os.environ[LAUNCHER_PID_VAR] = str(parent_pid)
    watch_parent(parent_pid)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # forked from a process that had joined a group: that group belongs to the parent, not to this run
        dist.destroy_process_group()
    try:
        fn, args, kwargs = payload.load() if isinstance(payload, _PayloadFile) else payload
        result = fn(*args, **kwargs)
    except Preempted as exc:  # not a failure: every rank saved and stops with the preemption exit code
        if local_rank == 0 and int(variables["NODE_RANK"]) == 0:
            with open(os.path.join(work, _PREEMPTED_FILE), "w") as f:
                json.dump({"message": exc.message, "signal": exc.signal, "checkpoint": exc.checkpoint}, f)
        raise
    except BaseException as exc:
        exit_if_peer_stopped_on_signal(work)
        if write_error(work, local_rank, exc) and not isinstance(exc, SystemExit):
            # the launching process reports the first rank that failed, once: printed here as well, the run's
            # output would hold every rank's traceback, most of them echoes ("Connection closed by peer")
            raise SystemExit(1) from None
        raise
    if local_rank == 0 and int(variables["NODE_RANK"]) == 0:
        path = os.path.join(work, _RESULT_FILE)
        torch.save(result, path + ".tmp")
        os.replace(path + ".tmp", path)
