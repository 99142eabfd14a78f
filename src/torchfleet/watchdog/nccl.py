"""PyTorch's NCCL flight recorder: switched on before the process group exists, dumped when a rank hangs (nccl runs).

The flight recorder keeps NCCL's own record of every collective the process group ran; with the variables set by
``nccl_flight_recorder_env`` it is dumped on an NCCL timeout, and the watchdog asks for a dump when it ends a rank
(``dump_nccl_trace``). The report names where the dumps are.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

#: (variable, value): torch 2.13 reads TORCH_FR_* and still the older TORCH_NCCL_* names
_FR_BUFFER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_FR_FILE = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FLIGHT_RECORDER_ENTRIES = "2000"


def nccl_flight_recorder_env(environ: dict[str, str] | Any = None, folder: str | None = None,
                             run_dir: str | None = None) -> str:
    """Switch on PyTorch's NCCL flight recorder (before init_process_group); the dump files' prefix.

    Sets the ring buffer size, dump-on-timeout and where the dump goes, leaving alone any of them the user
    set. The dump of rank r is ``<prefix><r>``, in ``folder``, else in ``nccl-trace`` of the launcher's private run
    folder ``run_dir`` (shared by the ranks), else in a new private folder (mkdtemp)."""
    env = os.environ if environ is None else environ
    if not any(env.get(k) for k in _FR_BUFFER):
        env.update(dict.fromkeys(_FR_BUFFER, FLIGHT_RECORDER_ENTRIES))
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    prefix = next((env[k] for k in _FR_FILE if env.get(k)), None)
    if prefix is None:
        job = env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID") or env.get("MASTER_PORT") or str(os.getpid())
        if folder is None:  # never a name others can guess and create first
            folder = os.path.join(run_dir, "nccl-trace") if run_dir else tempfile.mkdtemp(prefix=f"torchfleet-nccl-{job}-")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        prefix = os.path.join(folder, "rank_")
        env.update(dict.fromkeys(_FR_FILE, prefix))
    return prefix


def dump_prefix() -> str | None:
    """Where this process's flight recorder dumps go (``<prefix><rank>``); None when it was not switched on."""
    return next((os.environ[k] for k in _FR_FILE if os.environ.get(k)), None)


def dump_nccl_trace(rank: int) -> str | None:
    """Ask the NCCL flight recorder for its entries now and write them where it would on a timeout."""
    prefix = dump_prefix()
    if prefix is None:
        return None
    try:
        import torch.distributed as dist

        if dist.get_backend() != "nccl":
            return None
        from torch._C._distributed_c10d import _dump_nccl_trace as dump

        data = dump()
        path = f"{prefix}{rank}"
        with open(path, "wb") as f:
            f.write(data)
        return path
    except Exception:  # noqa: BLE001 - best effort: the report stands without it
        return None
