"""Which run a checkpoint belongs to: the run id, the per-run record of the files a run saved in a folder, and
the check that the file ``ckpt_path="last"`` chose is still the run's when it is read.

A run is this process and the ranks and restarts it launches: its id comes from the environment a launcher or
scheduler sets (``TF_RUN_ID``, which torchfleet exports to the ranks it starts and keeps across its restarts;
torchrun's ``TORCHELASTIC_RUN_ID``; SLURM's job and step) or is drawn once per process. Every Trainer checkpoint holds the id of the run
that wrote it (``"run_id"``), so ``ckpt_path="last"`` tells apart the files of two runs that share a folder.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

from torchfleet.checkpoint.distributed import META_NAME
from torchfleet.errors import CheckpointError

#: exported to the ranks and restarts a Trainer launches: they continue this process's run
RUN_ID_VAR = "TF_RUN_ID"

_run_id: str | None = None
#: the run each file chosen by ckpt_path="last" belonged to when it was chosen (checked again once it is read)
_chosen: dict[str, str] = {}


def _from_environment() -> str | None:
    if os.environ.get(RUN_ID_VAR):
        return os.environ[RUN_ID_VAR]
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return f"elastic-{elastic}"
    if os.environ.get("SLURM_JOB_ID"):  # a requeued job keeps its id
        return "slurm-" + "-".join(os.environ[v] for v in ("SLURM_JOB_ID", "SLURM_STEP_ID") if os.environ.get(v))
    return None


def run_id() -> str:
    """This process's run id (the environment's, else drawn at the first call)."""
    global _run_id
    if _run_id is None:
        _run_id = _from_environment() or uuid.uuid4().hex[:16]
    return _run_id


def continue_run(value: str) -> None:
    """This process continues the run ``value`` (it resumed that run's last checkpoint): its saves are that run's."""
    global _run_id
    _run_id = value


@contextlib.contextmanager
def exported_run_id() -> Iterator[None]:
    """``TF_RUN_ID`` set to this run's id while a stage launches ranks, so that they and any restart share it."""
    before = os.environ.get(RUN_ID_VAR)
    os.environ[RUN_ID_VAR] = run_id()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(RUN_ID_VAR, None)
        else:
            os.environ[RUN_ID_VAR] = before


def owner_of(path: str) -> str | None:
    """The run id written into the checkpoint ``path`` (a file, or a sharded directory's metadata), or None.

    Read with ``mmap`` and the safe unpickler: the tensors are not read. A file that cannot be read this way
    (an older torchfleet's, another program's, a refused one) has no owner here; loading it says what is wrong.
    """
    import torch

    target = os.path.join(path, META_NAME) if os.path.isdir(path) else path
    try:
        state = torch.load(target, map_location="cpu", mmap=True, weights_only=True)
    except Exception:  # noqa: BLE001  (any unreadable file: no claim; the load itself reports it)
        return None
    owner = state.get("run_id") if isinstance(state, dict) else None
    return owner if isinstance(owner, str) else None


def own_name(path: str) -> str:
    """``path``, or ``path`` with ``-v1``, ``-v2``... while that name holds another run's checkpoint (a fixed name,
    as ``preempted.ckpt``, in a folder two runs share: each keeps its own file)."""
    base, ext = os.path.splitext(path)
    candidate, n = path, 0
    while os.path.exists(candidate) and owner_of(candidate) not in (None, run_id()):
        n += 1
        candidate = f"{base}-v{n}{ext}"
    return candidate


def remember_choice(path: str, owner: str | None) -> None:
    """``path`` was chosen as run ``owner``'s last checkpoint: ``check_chosen`` compares once it is read."""
    if owner is not None:
        _chosen[os.path.normpath(path)] = owner


def check_chosen(path: str, checkpoint: dict) -> None:
    """Refuse a checkpoint chosen as one run's last that another run has since overwritten."""
    expected = _chosen.pop(os.path.normpath(path), None)
    found = checkpoint.get("run_id")
    if expected is not None and isinstance(found, str) and found != expected:
        raise CheckpointError(
            f"ckpt_path='last' chose {path!r} as the last checkpoint of run {expected}, but the file read holds run "
            f"{found}'s state: another run wrote the same file name in that folder meanwhile, so resuming from it "
            "would continue the other run. Nothing was loaded. Give each run its own ModelCheckpoint(dirpath=...) "
            "(or leave dirpath unset: each run gets its own version folder), or pass the path of the file to resume."
        )
