"""XLALauncher: run a function once per XLA device through torch_xla's launcher (``xmp.spawn``).

torch_xla starts one process per chip on a TPU host; where one process drives several devices (XLA's CPU
backend, TPU v2/v3 cores) it runs one thread per device in that process. Each replica then gets its own deep
copy of the function's arguments (the Trainer, the model), as Lightning's XLA launcher gives them. The replica
of global ordinal 0 writes its result to a file that ``launch`` returns, as ``ProcessLauncher`` does.

Replica threads of one process hang in their first all-reduce with torch_xla 2.9 as it is (issue 24: 4/4 runs):
each compiles its own program and the all-reduces inside get different op ids. ``serialise_compilation``
replaces ``torch_xla.sync`` in such a process: one replica looks its program up and compiles it, the others
take it from the cache (same op ids); every replica dispatches before any waits for its own device, and the
step-end cleanup comes after that wait. Every ``sync`` is then a collective of the process's replicas, as the
strategy's are. (A first version held a lock while compiling and dispatching: a program whose inputs were ready
ran inline under the lock and waited there for the others, 2 hangs in 6 runs on a loaded machine.)
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import torch

from torchfleet.launchers.base import Launcher

_RESULT_FILE = "result.pt"
#: held while the replacement sync is installed (the replica threads start together)
_installing = threading.Lock()
#: how long a replica waits for the others of its process at a sync (then the run fails, saying so)
DISPATCH_TIMEOUT_S = 600.0


class XLALauncher(Launcher):
    """Start one replica per XLA device with ``xmp.spawn`` and return the result of global ordinal 0."""

    runs_in_children = True

    def __init__(self, num_devices: int, start_method: str = "fork") -> None:
        self.num_devices = num_devices
        self.start_method = start_method

    @property
    def is_interactive_compatible(self) -> bool:
        return self.start_method == "fork"

    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        import torch_xla.distributed.xla_multiprocessing as xmp

        work = tempfile.mkdtemp(prefix="torchfleet-xla-")
        # torch_xla runs each dispatched program on a pool of one thread per core, where a program in an
        # all-reduce blocks its thread until the other replicas' programs join: on 2 cores with 2 replicas, any
        # other job in the pool left one replica's program unstarted (2 hangs in 4 runs on a loaded machine). The
        # replicas read the size when they start (a variable the user set is kept).
        pool = "XLA_THREAD_POOL_SIZE"
        previous = os.environ.get(pool)
        if previous is None:
            os.environ[pool] = str(max(os.cpu_count() or 1, 4 * self.num_devices))
        try:
            # nprocs=1 runs in this process; None means every device (the only other value torch_xla accepts)
            xmp.spawn(_replica, args=(fn, args, kwargs, work), nprocs=1 if self.num_devices == 1 else None,
                      start_method=self.start_method)
            path = os.path.join(work, _RESULT_FILE)
            return torch.load(path, weights_only=False) if os.path.exists(path) else None
        finally:
            if previous is None:
                os.environ.pop(pool, None)
            shutil.rmtree(work, ignore_errors=True)


def serialise_compilation() -> None:
    """Make ``torch_xla.sync`` (and so ``xm.mark_step``) safe for several replica threads of one process.

    torch_xla 2.9's sync is: the step marker (look the program up in the cache, compile it on a miss, dispatch
    it), then the step-end cleanup (metrics, step closures, the all-reduce token). Here the replicas of the
    process meet first; one of them (the leader) runs its step marker, and the others start theirs only once the
    leader's lookup is decided: a cache hit (they hit too), or its compilation added to the cache (they take that
    program, with the same all-reduce op ids), or its step marker returned. The leader may already be running its
    program by then (a program whose inputs are ready runs inline in the dispatching thread), waiting in its
    all-reduces for the others, which is why nothing is held while it dispatches. Then every replica waits for
    its own device, after all have dispatched, and only then runs the step-end cleanup. Installed once per
    process, only where replicas share it.
    """
    import torch_xla
    import torch_xla.core.xla_model as xm

    if getattr(torch_xla.sync, "serialised_by_torchfleet", False):
        return
    replicas = len(xm.get_xla_supported_devices())
    generation: dict[str, Any] = {}

    def lookups() -> tuple[int, int]:
        hits = torch_xla._XLAC._xla_counter_value("CachedCompile") or 0
        return int(hits), int(torch_xla._XLAC._xla_get_num_cached_compilation_graph())

    def open_generation() -> None:  # run once, by the last replica to arrive, before any leaves the barrier
        generation["before"] = lookups()
        generation["leader_returned"] = threading.Event()

    arrived = threading.Barrier(replicas, action=open_generation)
    # every replica of the process has dispatched its program before any waits for its device
    dispatched = threading.Barrier(replicas)

    def meet(barrier: threading.Barrier) -> int:
        try:
            return barrier.wait(DISPATCH_TIMEOUT_S)
        except threading.BrokenBarrierError:
            raise RuntimeError(
                f"An XLA replica waited {DISPATCH_TIMEOUT_S:.0f} s for the other replicas of its process to reach "
                "the same torch_xla.sync(): under XLAStrategy(mode='launch') every replica must sync at the same "
                "points (code that runs on one rank only must not sync or read device tensors)."
            ) from None

    def step_marker(reset_scope: bool) -> None:
        torch_xla._XLAC._xla_step_marker(torch_xla._XLAC._xla_get_default_device(), [], wait=False,
                                         reset_scope=reset_scope)

    def sync(wait: bool = False, reset_scope: bool = True) -> None:
        leader = meet(arrived) == 0
        before, leader_returned = generation["before"], generation["leader_returned"]
        if leader:
            try:
                step_marker(reset_scope)
            finally:
                leader_returned.set()
        else:
            while not leader_returned.wait(0.002):
                hits, programs = lookups()
                if hits > before[0] or programs > before[1]:
                    break
            step_marker(reset_scope)
        meet(dispatched)
        # this replica's device only: another replica may already have dispatched its next program
        xm.wait_device_ops(torch_xla._XLAC._xla_real_devices([torch_xla._XLAC._xla_get_default_device()]))
        if xm.is_master_ordinal():
            xm.ms.save_metrics()
        devctx = xm._run_step_closures()
        torch_xla._XLAC._set_all_reduce_token(devctx.device, None)

    sync.serialised_by_torchfleet = True  # type: ignore[attr-defined]
    with _installing:
        if not getattr(torch_xla.sync, "serialised_by_torchfleet", False):
            torch_xla.sync = sync


def _replica(index: int, fn: Callable[..., Any], args: tuple, kwargs: dict, work: str) -> None:
    import torch_xla.core.xla_model as xm

    threads = len(xm.get_xla_supported_devices()) > 1
    if threads:
        # several replicas share this process (one thread each): each trains its own copy
        serialise_compilation()
        fn, args, kwargs = copy.deepcopy((fn, args, kwargs))
    result = fn(*args, **kwargs)
    if index == 0:
        path = os.path.join(work, _RESULT_FILE)
        torch.save(result, path + ".tmp")
        os.replace(path + ".tmp", path)
    if not threads:  # one process per device: they leave together (torch_xla's own rendezvous, as Lightning's)
        xm.rendezvous("torchfleet-replica-end")
