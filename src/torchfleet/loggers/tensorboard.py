"""TensorBoardLogger: event files for TensorBoard (needs the optional tensorboard package).

Only global rank 0 writes: elsewhere ``experiment`` is an object that does nothing and the ``log_*`` methods
return at once, so a program that logs from every rank still gets one version folder with one event file.
"""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from torchfleet.errors import ConfigurationError
from torchfleet.loggers.base import DummyExperiment, FolderLogger, on_rank_zero, plain_params
from torchfleet.utilities import rank_zero_only


class TensorBoardLogger(FolderLogger):
    """Writes TensorBoard event files to ``<save_dir>/<name>/version_<n>/``."""

    def __init__(self, save_dir: str | os.PathLike | None = None, name: str = "logs", version: int | str | None = None,
                 *, root_dir: str | os.PathLike | None = None, **writer_kwargs: Any) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as exc:
            raise ConfigurationError(
                "TensorBoardLogger needs the tensorboard package, which is not installed. Install it with "
                "`pip install torchfleet[tensorboard]` (or `pip install tensorboard`), or use CSVLogger."
            ) from exc
        super().__init__(save_dir, name, version, root_dir=root_dir)
        self._writer_kwargs = writer_kwargs
        self._writer: Any = None

    @property
    def experiment(self) -> Any:
        """The ``SummaryWriter`` of the version folder (created on first use, on global rank 0 only)."""
        if not on_rank_zero():
            return DummyExperiment()
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            os.makedirs(self.log_dir, exist_ok=True)
            self._writer = SummaryWriter(log_dir=self.log_dir, **self._writer_kwargs)
        return self._writer

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        writer = self.experiment
        for key, value in metrics.items():
            writer.add_scalar(key, value, global_step=step)

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace | None = None) -> None:
        import yaml

        clean = plain_params(params)
        if clean:
            self.experiment.add_text("hparams", "```yaml\n" + yaml.safe_dump(clean, sort_keys=False) + "```")
        os.makedirs(self.log_dir, exist_ok=True)
        with open(os.path.join(self.log_dir, "hparams.yaml"), "w") as f:
            yaml.safe_dump(clean, f, sort_keys=False)

    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
