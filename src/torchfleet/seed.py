"""Random generators: one seed for Python's, NumPy's and torch's (inherited by launched processes), their
saved state (checkpoints, ``isolate_rng``), and distinct, reproducible seeds for DataLoader workers."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import random
from collections.abc import Iterator
from typing import Any

import torch

from torchfleet.errors import ConfigurationError

log = logging.getLogger("torchfleet")

#: the seed seed_everything set; launched processes (and reset_seed) read it back
SEED_ENV = "TF_GLOBAL_SEED"
#: "1" when seed_everything(workers=True) asked for seeded DataLoader workers
WORKERS_ENV = "TF_SEED_WORKERS"
#: the seeds seed_everything accepts (NumPy's legacy generator takes at most 32 bits)
min_seed_value = 0
max_seed_value = 2**32 - 1
_MAX_SEED = max_seed_value


def seed_everything(seed: int | None = None, workers: bool = False, verbose: bool = True) -> int:
    """Seed Python's, NumPy's and torch's generators (every process alike); returns the seed used.

    With no ``seed``, the one in ``TF_GLOBAL_SEED`` (set by an earlier call, inherited by launched
    processes) is used, else 0 with a warning (as Lightning). ``workers=True`` makes the Trainer give its
    DataLoaders ``worker_init_function`` where they have no ``worker_init_fn`` of their own. ``verbose`` logs
    "Seed set to N" (``[rank: R] Seed set to N`` on rank R > 0), printed on stderr as Lightning does unless the
    program configured logging itself (``show_info_lines``), and allows the warning.
    """
    if seed is None:
        env = os.environ.get(SEED_ENV)
        if env is None:
            seed = 0
            if verbose:
                from torchfleet.rank_zero import rank_zero_warn

                rank_zero_warn(f"No seed found: seed_everything() set the seed to {seed}. Pass seed=... (or set "
                               f"{SEED_ENV}) to choose it; later calls without a seed reuse this one.")
        else:
            try:
                seed = int(env)
            except ValueError:
                raise ConfigurationError(
                    f"{SEED_ENV}={env!r} is not a seed (Invalid seed specified): set it to an int in [0, {_MAX_SEED}], "
                    "or unset it (seed_everything() then uses 0)."
                ) from None
    if isinstance(seed, bool) or not isinstance(seed, (int, float)) or (isinstance(seed, float) and
                                                                        not seed.is_integer()):
        raise ConfigurationError(f"seed={seed!r} is not an int: give an int in [0, {_MAX_SEED}] (2**32 - 1).")
    if not (0 <= seed <= _MAX_SEED):
        raise ConfigurationError(f"seed={seed!r} is not in bounds: give an int in [0, {_MAX_SEED}] (2**32 - 1).")
    seed = int(seed)  # a whole float (1e3) is that int, as Lightning takes it
    if verbose:
        from torchfleet.rank_zero import rank_prefixed_message, show_info_lines

        # Lightning prints the line here on every rank, from a handler its import adds; ours is added now (importing
        # torchfleet configures no logging), and not where the program configured logging itself
        show_info_lines()
        log.info(rank_prefixed_message(f"Seed set to {seed}"))
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    # children started by our launchers inherit the seed this way; it is a value, not configuration
    os.environ[SEED_ENV] = str(seed)
    os.environ[WORKERS_ENV] = "1" if workers else "0"
    return seed


def reset_seed() -> None:
    """Seed again with what ``seed_everything`` set in this process or its launcher (nothing if it was never called).

    For processes started after ``seed_everything`` (spawned ranks, a worker pool): they inherit the
    environment, not the generators' states.
    """
    env = os.environ.get(SEED_ENV)
    if env is not None:
        seed_everything(int(env), workers=os.environ.get(WORKERS_ENV) == "1", verbose=False)


def _worker_seeds(base_seed: int, worker_id: int, rank: int) -> tuple[int, int, list[int]]:
    """Three seeds (torch, Python, NumPy) for one worker of one rank, a pure function of the three numbers."""
    digest = hashlib.blake2b(f"torchfleet-worker:{base_seed}:{worker_id}:{rank}".encode(), digest_size=32).digest()
    torch_seed = int.from_bytes(digest[:8], "little")
    python_seed = int.from_bytes(digest[8:24], "little")  # Python's generator takes a seed of any size
    numpy_seed = [int.from_bytes(digest[i:i + 4], "little") for i in range(24, 32, 4)]
    return torch_seed, python_seed, numpy_seed


def worker_init_function(worker_id: int, rank: int | None = None) -> None:
    """A DataLoader ``worker_init_fn``: seed this worker's torch, Python and NumPy generators.

    The seeds are derived from the seed torch gave the worker (drawn from the main process's
    generator, so a seeded run repeats them and each epoch differs), the worker id and the global
    ``rank`` (default: this process's), so no two workers of a run, on any rank, share a stream.
    """
    if rank is None:
        from torchfleet.rank_zero import rank_zero_only

        rank = rank_zero_only.rank
    base_seed = torch.initial_seed() - worker_id  # torch seeds worker i with base + i
    torch_seed, python_seed, numpy_seed = _worker_seeds(base_seed, worker_id, rank)
    torch.manual_seed(torch_seed)
    random.seed(python_seed)
    try:
        import numpy as np

        np.random.seed(numpy_seed)
    except ImportError:
        pass


#: Lightning's name for :func:`worker_init_function` (same arguments), so ported imports keep their name
pl_worker_init_function = worker_init_function


def add_worker_init_fn(dataloader: Any, rank: int) -> Any:
    """Give ``dataloader`` ``worker_init_function`` (for ``rank``) when ``seed_everything(workers=True)`` asked
    for it, the loader starts workers and the user set no ``worker_init_fn``. Returns the loader."""
    if (os.environ.get(WORKERS_ENV) == "1" and isinstance(dataloader, torch.utils.data.DataLoader)
            and dataloader.num_workers > 0 and dataloader.worker_init_fn is None):
        dataloader.worker_init_fn = functools.partial(worker_init_function, rank=rank)
    return dataloader


def capture_rng(include_cuda: bool = True) -> dict[str, Any]:
    """The state of every random generator a training step may draw from, as tensors and plain Python values.

    Plain values keep checkpoints loadable with ``torch.load(path, weights_only=True)``: NumPy's own state
    holds an ndarray, which that loader refuses.
    """
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
        state["numpy"] = (str(kind), keys.tolist(), int(pos), int(has_gauss), float(cached_gaussian))
    except ImportError:
        pass
    # is_initialized(), not is_available(): asking the latter starts the CUDA driver in a CPU run
    if include_cuda and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what ``capture_rng`` returned (also the ndarray form of NumPy's state in older checkpoints)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached_gaussian = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))
    if "cuda" in state and torch.cuda.is_initialized():
        # only where this run uses CUDA (a GPU checkpoint may resume on the CPU), and only for the devices
        # this machine has (it may have been written on one with more)
        for index, device_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, index)


@contextlib.contextmanager
def isolate_rng(include_cuda: bool = True) -> Iterator[None]:
    """Draw random numbers inside the block without changing what is drawn after it.

    Python's, NumPy's and torch's generators (and CUDA's, once CUDA is in use, unless
    ``include_cuda=False``) are put back as they were on entry, also when the block raises.
    """
    state = capture_rng(include_cuda)
    try:
        yield
    finally:
        restore_rng(state)
