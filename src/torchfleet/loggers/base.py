"""Logger: where logged metrics and hyperparameters go. The Trainer calls loggers on global rank 0 only."""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from argparse import Namespace
from collections.abc import Mapping
from typing import Any


def next_version(root: str) -> int:
    """The first unused N for ``<root>/version_N``."""
    if not os.path.isdir(root):
        return 0
    used = [int(m.group(1)) for d in os.listdir(root) if (m := re.fullmatch(r"version_(\d+)", d))]
    return max(used) + 1 if used else 0


def plain_params(params: Mapping[str, Any] | Namespace | None) -> dict[str, Any]:
    """Hyperparameters as plain YAML-safe values (anything else becomes its repr)."""
    if params is None:
        return {}
    if isinstance(params, Namespace):
        params = vars(params)

    def clean(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, Mapping):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return repr(v)

    return {str(k): clean(v) for k, v in params.items()}


class Logger(ABC):
    """Receives metrics (``log_metrics``) and hyperparameters; writes them somewhere.

    The Trainer calls loggers on global rank 0 only, so implementations need not check ranks.
    """

    @property
    @abstractmethod
    def name(self) -> str: ...

    @property
    @abstractmethod
    def version(self) -> int | str: ...

    @property
    def save_dir(self) -> str | None:
        return None

    @property
    def log_dir(self) -> str | None:
        return None

    @abstractmethod
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Record ``metrics`` at ``step``."""

    def log_hyperparams(self, params: Mapping[str, Any] | Namespace) -> None:
        """Record the run's hyperparameters."""

    def save(self) -> None:
        """Flush what is buffered."""

    def finalize(self, status: str) -> None:
        """The run ended with ``status`` ("success" or "failed"): flush and close."""
        self.save()

    @property
    def experiment(self) -> Any:
        """The underlying writer object."""
        return None

    def agree_version(self, strategy: Any) -> None:
        """Make every rank use rank 0's version (and so its folder). Loggers without folders: nothing to agree."""


class FolderLogger(Logger):
    """A logger writing into ``<save_dir>/<name>/version_<n>/`` (n: the first unused, unless given)."""

    def __init__(self, save_dir: str | os.PathLike, name: str = "logs", version: int | str | None = None) -> None:
        self._save_dir = os.fspath(save_dir)
        self._name = name
        self._version = version
        self._version_given = version is not None

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> int | str:
        if self._version is None:
            self._version = next_version(os.path.join(self._save_dir, self._name))
        return self._version

    def agree_version(self, strategy: Any) -> None:
        # "the first unused version" differs between ranks once rank 0 has created its folder
        self._version = strategy.broadcast(self.version if strategy.is_global_zero else None)

    def use_version_of(self, path: str | os.PathLike) -> bool:
        """Continue in the version folder that holds ``path`` (a checkpoint under ``<save_dir>/<name>/<version>/``).

        Returns whether it did: not when ``path`` lies elsewhere or the constructor was given a version.
        """
        if self._version_given:
            return False
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(os.path.join(self._save_dir, self._name)))
        folder = rel.split(os.sep)[0]
        if folder in (os.curdir, os.pardir) or folder == rel:
            return False
        match = re.fullmatch(r"version_(\d+)", folder)
        self._version = int(match.group(1)) if match else folder
        return True

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def log_dir(self) -> str:
        version = self.version
        return os.path.join(self._save_dir, self._name, version if isinstance(version, str) else f"version_{version}")
