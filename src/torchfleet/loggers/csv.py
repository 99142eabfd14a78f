"""CSVLogger: metrics.csv (one row per step, a column per metric) and hparams.yaml in a versioned folder."""

from __future__ import annotations

import csv
import os
import warnings
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from torchfleet.loggers.base import (
    DummyExperiment,
    FolderLogger,
    is_url,
    on_rank_zero,
    plain_params,
    with_prefix,
)
from torchfleet.utilities import rank_zero_only


class CSVWriter:
    """What ``CSVLogger.experiment`` returns: the writer of one version folder's ``metrics.csv`` and ``hparams.yaml``.

    Values logged at one step share a row; new metric names add columns (the file is rewritten then).
    A folder that already holds a ``metrics.csv`` (an explicit ``version=`` used before) is reported and that
    file removed, unless ``append``: a resumed run (``--ckpt_path=last``) keeps the rows already there and adds
    its own. ``log_dir`` may be an fsspec URL (``s3://bucket/logs``, ``memory://x``).
    """

    NAME_METRICS_FILE = "metrics.csv"
    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, log_dir: str, append: bool = False) -> None:
        self.log_dir = log_dir
        self.metrics_file_path = os.path.join(log_dir, self.NAME_METRICS_FILE)
        self.hparams: dict[str, Any] = {}
        self._rows: dict[int, dict[str, Any]] = {}
        self._written: list[dict[str, Any]] = []
        self._columns: list[str] = []
        self._file_columns: list[str] = []
        self._fs: Any = None
        if is_url(log_dir):
            import fsspec

            self._fs = fsspec.core.url_to_fs(log_dir)[0]
        if not append:
            self._check_log_dir_exists()
        if self._isfile(self.metrics_file_path):
            # resuming (or the check above was skipped): the rows already there stay, this run's follow them
            with self._open(self.metrics_file_path, "r") as f:
                reader = csv.DictReader(f)
                self._written = [{k: v for k, v in row.items() if v != ""} for row in reader]
                self._columns = list(reader.fieldnames or [])
                self._file_columns = list(self._columns)
        self._makedirs(log_dir)

    def _check_log_dir_exists(self) -> None:
        """Warn about, and remove, a metrics.csv an earlier run left in this folder."""
        if not self._isfile(self.metrics_file_path):
            return
        # "Experiment logs directory ... exists and is not empty" is Lightning's phrase, kept for warning filters
        warnings.warn(
            f"Experiment logs directory {self.log_dir} exists and is not empty: it already holds a "
            f"{self.NAME_METRICS_FILE} from an earlier run, which is removed; this run's metrics replace it. Pass "
            "another version=, or none for the next unused one, to keep both.",
            stacklevel=4,
        )
        if self._fs is not None:
            self._fs.rm_file(self.metrics_file_path)
        else:
            os.remove(self.metrics_file_path)

    def _isfile(self, path: str) -> bool:
        return self._fs.isfile(path) if self._fs is not None else os.path.isfile(path)

    def _makedirs(self, path: str) -> None:
        if self._fs is not None:
            self._fs.makedirs(path, exist_ok=True)
        else:
            os.makedirs(path, exist_ok=True)

    def _open(self, path: str, mode: str) -> Any:
        return self._fs.open(path, mode, newline="") if self._fs is not None else open(path, mode, newline="")

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The rows not yet written to the file, in step order."""
        return [self._rows[k] for k in sorted(self._rows)]

    def log_metrics(self, metrics_dict: Mapping[str, Any], step: int | None = None) -> None:
        key = step if step is not None else (max(self._rows) + 1 if self._rows else len(self._written))
        row = self._rows.setdefault(key, {"step": key})
        row.update({k: v.item() if hasattr(v, "item") else v for k, v in metrics_dict.items()})

    def log_hparams(self, params: Mapping[str, Any]) -> None:
        """Add ``params`` to the run's hyperparameters and write them all to hparams.yaml."""
        import yaml

        self.hparams.update(params)
        with self._open(os.path.join(self.log_dir, self.NAME_HPARAMS_FILE), "w") as f:
            yaml.safe_dump(plain_params(self.hparams), f, sort_keys=False)

    def save(self) -> None:
        if not self._rows:
            return
        rows = self.metrics
        for row in rows:
            for key in row:
                if key not in self._columns:
                    self._columns.append(key)
        self._makedirs(self.log_dir)
        if self._columns != self._file_columns or not self._isfile(self.metrics_file_path):
            # new columns (or this run's first save): write the whole file with the wider header
            with self._open(self.metrics_file_path, "w") as f:
                writer = csv.DictWriter(f, fieldnames=self._columns)
                writer.writeheader()
                writer.writerows(self._written + rows)
            self._file_columns = list(self._columns)
        else:
            with self._open(self.metrics_file_path, "a") as f:
                csv.DictWriter(f, fieldnames=self._columns).writerows(rows)
        self._written.extend(rows)
        self._rows.clear()


class CSVLogger(FolderLogger):
    """Writes ``<save_dir>/<name>/version_<n>/metrics.csv`` and ``hparams.yaml`` (``root_dir=`` names save_dir too).

    Rows are buffered and written every ``flush_logs_every_n_steps`` steps and at the end, so a
    logged step costs a dict update. ``experiment`` is the ``CSVWriter``. Only global rank 0 writes
    (elsewhere ``experiment`` does nothing and the ``log_*`` methods return at once).
    """

    def __init__(self, save_dir: str | os.PathLike | None = None, name: str | None = "logs",
                 version: int | str | None = None, prefix: str = "", flush_logs_every_n_steps: int = 100, *,
                 root_dir: str | os.PathLike | None = None) -> None:
        super().__init__(save_dir, name, version, root_dir=root_dir, prefix=prefix)
        self.flush_every = flush_logs_every_n_steps
        self._writer: CSVWriter | None = None
        self._pending = 0

    def use_version_of(self, path: str | os.PathLike) -> bool:
        """As FolderLogger's; the rows already in that folder's metrics.csv are kept, new ones appended."""
        if not super().use_version_of(path):
            return False
        if on_rank_zero() and (self._writer is None or not (self._writer._rows or self._writer._written)):
            self._writer = CSVWriter(self.log_dir, append=True)
        return True

    @property
    def experiment(self) -> CSVWriter | DummyExperiment:
        """The ``CSVWriter`` of the version folder (created on first use, on global rank 0 only)."""
        if not on_rank_zero():
            return DummyExperiment()
        if self._writer is None:
            self.claim_version()  # a folder of its own, even beside another run starting now
            self._writer = CSVWriter(self.log_dir)
        return self._writer

    @property
    def metrics_file_path(self) -> str:
        return os.path.join(self.log_dir, CSVWriter.NAME_METRICS_FILE)

    metrics_file = metrics_file_path

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.experiment.log_metrics(with_prefix(metrics, self._prefix), step)
        self._pending += 1
        if self._pending >= self.flush_every:
            self.save()

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace | None = None) -> None:
        """Record ``params`` (none: write the ones recorded so far) in hparams.yaml."""
        self.experiment.log_hparams(plain_params(params))

    def save(self) -> None:
        if self._writer is not None:
            self._writer.save()
        self._pending = 0
