"""Rank-zero helpers every layer may use: ``rank_zero_only`` (+ ``.rank``), the rank-zero logging functions, the banner.

A leaf (it imports nothing of torchfleet). Ported code imports these from ``torchfleet.utilities`` (Lightning's
path); ``from torchfleet import cli_lightning_logo`` (Lightning's name for :func:`cli_logo`).
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("torchfleet")

T = TypeVar("T")


def show_info_lines() -> None:
    """Print torchfleet's info messages (model summary, strategy choice) like a training tool should, once a Trainer
    is built or runs a stage in a new process, unless the program configured logging for them itself (a handler of
    its own on the "torchfleet" logger or on the root logger). Importing torchfleet configures no logging."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


# where launchers other than ours put the global rank before the process group exists
_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JSM_NAMESPACE_RANK")


def _detect_rank() -> int:
    """This process's global rank: the process group's, else the launcher's environment, else 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    for name in _RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    # torchfleet's script launcher exports LOCAL_RANK and NODE_RANK (not RANK): exact on node 0; on other nodes
    # never 0, and exact once the process group is joined
    local, node = os.environ.get("LOCAL_RANK", "0"), os.environ.get("NODE_RANK", "0")
    if local.isdigit() and node.isdigit():
        return int(local) + int(node)
    return 0


class _RankZeroOnly:
    """``@rank_zero_only`` runs the function on global rank 0 only (elsewhere it returns ``default``, None).

    ``rank_zero_only.rank`` is this process's global rank, read when asked (from the process group once it
    exists); assigning it fixes the value, as Lightning allows.
    """

    def __init__(self) -> None:
        self._rank: int | None = None

    @property
    def rank(self) -> int:
        return self._rank if self._rank is not None else _detect_rank()

    @rank.setter
    def rank(self, value: int | None) -> None:
        self._rank = value

    def __call__(self, fn: Callable[..., T], default: Any = None) -> Callable[..., T | Any]:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs) if self.rank == 0 else default

        return wrapped


rank_zero_only = _RankZeroOnly()


def rank_prefixed_message(message: str, rank: int | None = None) -> str:
    """``message`` with ``[rank: N] `` before it in a multi-process run (world size from the environment or group)."""
    import torch.distributed as dist

    many = (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1) or \
        int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
    if rank is None and not many:
        return message
    return f"[rank: {rank_zero_only.rank if rank is None else rank}] {message}"


def rank_zero_info(message: Any, *args: Any, stacklevel: int = 2, **kwargs: Any) -> None:
    """Log ``message`` at INFO on the "torchfleet" logger, on global rank 0 only."""
    if rank_zero_only.rank == 0:
        log.info(message, *args, stacklevel=stacklevel, **kwargs)


def rank_zero_debug(message: Any, *args: Any, stacklevel: int = 2, **kwargs: Any) -> None:
    """Log ``message`` at DEBUG on the "torchfleet" logger, on global rank 0 only."""
    if rank_zero_only.rank == 0:
        log.debug(message, *args, stacklevel=stacklevel, **kwargs)


def rank_zero_warn(message: str | Warning, category: type[Warning] = UserWarning, stacklevel: int = 2,
                   **kwargs: Any) -> None:
    """``warnings.warn(message)`` on global rank 0 only."""
    if rank_zero_only.rank == 0:
        warnings.warn(message, category, stacklevel=stacklevel + 1, **kwargs)


def rank_zero_deprecation(message: str | Warning, stacklevel: int = 2, **kwargs: Any) -> None:
    """``warnings.warn(message, LightningDeprecationWarning)`` (a DeprecationWarning) on global rank 0 only."""
    rank_zero_warn(message, LightningDeprecationWarning, stacklevel=stacklevel + 1, **kwargs)


class LightningDeprecationWarning(DeprecationWarning):
    """The category of ``rank_zero_deprecation``'s warnings (a DeprecationWarning: its filters apply)."""


class WarningCache(set):
    """Warn (or log) each distinct message once, on global rank 0: a set of the messages already given."""

    def warn(self, message: str, stacklevel: int = 2, **kwargs: Any) -> None:
        if message not in self:
            self.add(message)
            rank_zero_warn(message, stacklevel=stacklevel + 1, **kwargs)

    def deprecation(self, message: str, stacklevel: int = 2, **kwargs: Any) -> None:
        if message not in self:
            self.add(message)
            rank_zero_deprecation(message, stacklevel=stacklevel + 1, **kwargs)

    def info(self, message: str, stacklevel: int = 2, **kwargs: Any) -> None:
        if message not in self:
            self.add(message)
            rank_zero_info(message, stacklevel=stacklevel + 1, **kwargs)


_LOGO = r"""
 _                 _      __ _           _
| |_ ___  _ __ ___| |__  / _| | ___  ___| |_
| __/ _ \| '__/ __| '_ \| |_| |/ _ \/ _ \ __|
| || (_) | | | (__| | | |  _| |  __/  __/ |_
 \__\___/|_|  \___|_| |_|_| |_|\___|\___|\__|
"""


def cli_logo() -> None:
    """Print torchfleet's banner and version to stdout, once, on global rank 0 (optional: call it or not)."""
    if rank_zero_only.rank == 0:
        from torchfleet import __version__

        print(f"{_LOGO.rstrip()}   {__version__}\n", flush=True)


#: Lightning's name, so ``from lightning.pytorch import cli_lightning_logo`` ports by its import line alone
cli_lightning_logo = cli_logo

__all__ = ["rank_zero_only", "rank_zero_info", "rank_zero_warn", "rank_zero_debug", "rank_zero_deprecation",
           "rank_prefixed_message", "WarningCache", "LightningDeprecationWarning", "cli_logo", "cli_lightning_logo"]
