"""DeviceStatsMonitor: the accelerator's figures (memory, utilisation; on a CPU psutil's) logged around each batch."""

from __future__ import annotations

from typing import Any

from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks.base import Callback


class DeviceStatsMonitor(Callback):
    """Log ``trainer.accelerator.get_device_stats(root_device)`` at the start and end of each training, validation
    and test batch, as ``DeviceStatsMonitor.<hook>/<figure>`` (Lightning's names and cadence: in training every
    ``log_every_n_steps`` steps, in evaluation every batch). ``cpu_stats``: None logs the CPU's figures when the
    device is the CPU (psutil needed), True adds them for another device too, False never logs the CPU's.
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        self._cpu_stats = cpu_stats
        self._stepped = 0  # optimizer steps before the training batch in progress: the figures' logging step
        self._eval_batches = 0  # batches of the running validation or test

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise ConfigurationError("Cannot use `DeviceStatsMonitor` callback with `Trainer(logger=False)`: it "
                                     "writes its figures to the loggers. Give the Trainer a logger, or remove it.")
        if self._cpu_stats is None and trainer.strategy.root_device.type == "cpu":
            try:
                import psutil  # noqa: F401
            except ImportError:
                raise ModuleNotFoundError("`DeviceStatsMonitor` cannot log CPU stats as `psutil` is not installed: "
                                          "pip install psutil, or pass cpu_stats=False.") from None

    def _due(self, trainer: Any) -> bool:
        if trainer.log_every_n_steps == 0:
            return False
        if trainer.state.stage != "train":
            # as Lightning: the evaluation's batches so far (this one included), every log_every_n_steps-th
            return self._eval_batches % trainer.log_every_n_steps == 0
        # as Lightning: the steps before this batch, + 1, at its start and at its end alike
        return (self._stepped + 1) % trainer.log_every_n_steps == 0 or trainer.should_stop

    def _log(self, trainer: Any, key: str) -> None:
        if not self._due(trainer):
            return
        device = trainer.strategy.root_device
        if self._cpu_stats is False and device.type == "cpu":
            return
        stats = dict(trainer.accelerator.get_device_stats(device))
        if self._cpu_stats and device.type != "cpu":
            from torchfleet.accelerators.cpu import get_cpu_stats

            stats.update(get_cpu_stats())
        prefix = f"{type(self).__qualname__}.{key}"
        for logger in trainer.loggers:
            separator = getattr(logger, "group_separator", "/")
            logger.log_metrics({f"{prefix}{separator}{k}": v for k, v in stats.items()}, step=self._stepped)

    def on_validation_start(self, trainer: Any, module: Any) -> None:
        self._eval_batches = 0

    def on_test_start(self, trainer: Any, module: Any) -> None:
        self._eval_batches = 0

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self._stepped = trainer.global_step
        self._log(trainer, "on_train_batch_start")

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._log(trainer, "on_train_batch_end")

    def on_validation_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self._eval_batches += 1
        self._log(trainer, "on_validation_batch_start")

    def on_validation_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_validation_batch_end")

    def on_test_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batches += 1
        self._log(trainer, "on_test_batch_start")

    def on_test_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_test_batch_end")
