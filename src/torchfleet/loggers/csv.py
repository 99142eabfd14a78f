"""CSVLogger: metrics.csv (one row per step, a column per metric) and hparams.yaml in a versioned folder."""

from __future__ import annotations

import csv
import os
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from torchfleet.loggers.base import FolderLogger, plain_params


class CSVLogger(FolderLogger):
    """Writes ``<save_dir>/<name>/version_<n>/metrics.csv`` and ``hparams.yaml``.

    Rows are buffered and written every ``flush_logs_every_n_steps`` steps and at the end, so a
    logged step costs a dict update. New metric names add columns (the file is rewritten then).
    """

    def __init__(self, save_dir: str | os.PathLike, name: str = "logs", version: int | str | None = None,
                 flush_logs_every_n_steps: int = 100) -> None:
        super().__init__(save_dir, name, version)
        self.flush_every = flush_logs_every_n_steps
        self._rows: dict[int, dict[str, Any]] = {}
        self._written: list[dict[str, Any]] = []
        self._columns: list[str] = []
        self._file_columns: list[str] = []
        self._pending = 0

    @property
    def metrics_file(self) -> str:
        return os.path.join(self.log_dir, "metrics.csv")

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        key = step if step is not None else (max(self._rows) + 1 if self._rows else 0)
        row = self._rows.setdefault(key, {"step": key})
        row.update(metrics)
        self._pending += 1
        if self._pending >= self.flush_every:
            self.save()

    def log_hyperparams(self, params: Mapping[str, Any] | Namespace) -> None:
        import yaml

        os.makedirs(self.log_dir, exist_ok=True)
        with open(os.path.join(self.log_dir, "hparams.yaml"), "w") as f:
            yaml.safe_dump(plain_params(params), f, sort_keys=False)

    def save(self) -> None:
        if not self._rows:
            return
        rows = [self._rows[k] for k in sorted(self._rows)]
        for row in rows:
            for key in row:
                if key not in self._columns:
                    self._columns.append(key)
        os.makedirs(self.log_dir, exist_ok=True)
        path = self.metrics_file
        if self._columns != self._file_columns or not os.path.exists(path):
            # new columns: rewrite the whole file with the wider header
            with open(path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self._columns)
                writer.writeheader()
                writer.writerows(self._written + rows)
            self._file_columns = list(self._columns)
        else:
            with open(path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=self._columns).writerows(rows)
        self._written.extend(rows)
        self._rows.clear()
        self._pending = 0

    def use_version_of(self, path: str | os.PathLike) -> bool:
        """As FolderLogger's; the rows already in that folder's metrics.csv are kept, new ones appended."""
        if not super().use_version_of(path):
            return False
        if os.path.isfile(self.metrics_file) and not self._written:
            with open(self.metrics_file, newline="") as f:
                reader = csv.DictReader(f)
                self._written = [{k: v for k, v in row.items() if v != ""} for row in reader]
                self._columns = list(reader.fieldnames or [])
                self._file_columns = list(self._columns)
        return True

    @property
    def experiment(self) -> Any:
        return self
