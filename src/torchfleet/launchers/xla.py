"""XLALauncher: run a function once per XLA device through torch_xla's launcher (``xmp.spawn``).

torch_xla starts one process per chip on a TPU host; where one process drives several devices (XLA's CPU
backend, TPU v2/v3 cores) it runs one thread per device in that process. Each replica then gets its own deep
copy of the function's arguments (the Trainer, the model), as Lightning's XLA launcher gives them. The replica
of global ordinal 0 writes its result to a file that ``launch`` returns, as ``ProcessLauncher`` does.

On XLA's CPU backend the replicas of one process compile their programs separately, and the all-reduces inside
get different op ids unless the compilations run one at a time: ``compile_lock`` is what the strategy holds
around each step's ``sync`` (issue 24: 4/4 runs hung without it, 17/17 passed with it and a wait for the device
before the step ends).
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


def _replica(index: int, fn: Callable[..., Any], args: tuple, kwargs: dict, work: str) -> None:
    import torch_xla.core.xla_model as xm

    if len(xm.get_xla_supported_devices()) > 1:
        # several replicas share this process (one thread each): each trains its own copy
        fn, args, kwargs = copy.deepcopy((fn, args, kwargs))
    result = fn(*args, **kwargs)
    if index == 0:
        path = os.path.join(work, _RESULT_FILE)
        torch.save(result, path + ".tmp")
        os.replace(path + ".tmp", path)
    xm.rendezvous("torchfleet-replica-end")
