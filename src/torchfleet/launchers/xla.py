"""XLALauncher: run a function once per XLA device through torch_xla's launcher (``xmp.spawn``).

torch_xla starts one process per chip on a TPU host; where one process drives several devices (XLA's CPU
backend, TPU v2/v3 cores) it runs one thread per device in that process. Each replica then gets its own deep
copy of the function's arguments (the Trainer, the model), as Lightning's XLA launcher gives them. The replica
of global ordinal 0 writes its result to a file that ``launch`` returns, as ``ProcessLauncher`` does.

Replica threads of one process hang in their first all-reduce with torch_xla 2.9 as it is (issue 24: 4/4 runs):
each compiles its own program and the all-reduces inside get different op ids. ``serialise_compilation``
replaces ``torch_xla.sync`` in such a process: compiled one replica at a time (the others take the program from
the cache, same op ids), no buffer donation (a donating program runs inline under the lock), every replica
dispatched before any waits for its device, the step-end cleanup after that wait. Every ``sync`` is then a
collective of the process's replicas, as the strategy's are.
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
#: held by a replica while it compiles and dispatches a step (one at a time per process)
compile_lock = threading.Lock()
#: how long a replica waits for the others of its process to dispatch their step (then the run fails, saying so)
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
        try:
            # nprocs=1 runs in this process; None means every device (the only other value torch_xla accepts)
            xmp.spawn(_replica, args=(fn, args, kwargs, work), nprocs=1 if self.num_devices == 1 else None,
                      start_method=self.start_method)
            path = os.path.join(work, _RESULT_FILE)
            return torch.load(path, weights_only=False) if os.path.exists(path) else None
        finally:
            shutil.rmtree(work, ignore_errors=True)


def serialise_compilation() -> None:
    """Make ``torch_xla.sync`` (and so ``xm.mark_step``) safe for several replica threads of one process.

    torch_xla 2.9's sync is: the step marker (compile, or take the compiled program from the cache, and
    dispatch), then the step-end cleanup (metrics, step closures, the all-reduce token). Here the step marker
    runs under ``compile_lock``, so a replica whose program another replica compiled takes it from the cache
    with the same all-reduce op ids, and the device's work is waited for before the cleanup. Installed once per
    process, only where replicas share it.
    """
    import torch_xla
    import torch_xla.core.xla_model as xm

    if getattr(torch_xla.sync, "serialised_by_torchfleet", False):
        return
    # a program that donates its input buffers (parameters updated in place) runs inline in the thread that
    # dispatches it, under the lock, and waits there for the other replicas' all-reduces: no donation here
    os.environ["XLA_ENABLE_PARAM_ALIASING"] = "0"
    # every replica of the process has dispatched its program before any waits for the device: a replica that
    # waits in torch_xla keeps the GIL, and one still dispatching would never join the all-reduces
    dispatched = threading.Barrier(len(xm.get_xla_supported_devices()))

    def sync(wait: bool = False, reset_scope: bool = True) -> None:
        with compile_lock:
            torch_xla._XLAC._xla_step_marker(torch_xla._XLAC._xla_get_default_device(), [], wait=False,
                                             reset_scope=reset_scope)
        try:
            dispatched.wait(DISPATCH_TIMEOUT_S)
        except threading.BrokenBarrierError:
            raise RuntimeError(
                f"An XLA replica waited {DISPATCH_TIMEOUT_S:.0f} s for the other replicas of its process to reach "
                "the same torch_xla.sync(): under XLAStrategy(mode='launch') every replica must sync at the same "
                "points (code that runs on one rank only must not sync or read device tensors)."
            ) from None
        # this replica's device only: another replica may already have dispatched its next program, whose
        # all-reduce waits for this one
        xm.wait_device_ops(torch_xla._XLAC._xla_real_devices([torch_xla._XLAC._xla_get_default_device()]))
        if xm.is_master_ordinal():
            xm.ms.save_metrics()
        devctx = xm._run_step_closures()
        torch_xla._XLAC._set_all_reduce_token(devctx.device, None)

    sync.serialised_by_torchfleet = True  # type: ignore[attr-defined]
    with compile_lock:
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
