"""DataModule: the data of a run — download once, split per stage, and the dataloaders."""

from __future__ import annotations

from typing import Any

from torchfleet.errors import ConfigurationError
from torchfleet.module import HyperparametersMixin

# the distributed-sampler helpers live in samplers.py; importable from here too
from torchfleet.samplers import ExactDistributedSampler, inject_distributed_sampler

__all__ = ["DataModule", "ExactDistributedSampler", "inject_distributed_sampler"]


class DataModule(HyperparametersMixin):
    """Owns the datasets and returns dataloaders; ``prepare_data`` runs on one process, ``setup`` on all.

    ``self.save_hyperparameters()`` in ``__init__`` records its arguments, as a Module's; the Trainer logs
    them together with the Module's.
    """

    def __init__(self) -> None:
        self.trainer: Any = None

    def prepare_data(self) -> None:
        """Download or write files; runs on global rank 0 only (before the others' ``setup``)."""

    def setup(self, stage: str) -> None:
        """Build the datasets for ``stage`` ("fit", "validate", "test" or "predict") on every process."""

    def teardown(self, stage: str) -> None:
        """Release what ``setup`` built."""

    def train_dataloader(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no train_dataloader()")

    def val_dataloader(self) -> Any:
        return []

    def test_dataloader(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no test_dataloader()")

    def predict_dataloader(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no predict_dataloader()")

    def state_dict(self) -> dict[str, Any]:
        """State to keep in checkpoints (e.g. a curriculum position)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch


def loaders_or_datamodule(loaders: Any, datamodule: Any, call: str) -> tuple[Any, Any]:
    """``(loaders, datamodule)`` with a DataModule given in the dataloaders' place moved to the datamodule's.

    As Lightning, ``trainer.fit(model, dm)`` and ``trainer.test(model, dm)`` mean ``datamodule=dm``.
    """
    if not isinstance(loaders, DataModule):
        return loaders, datamodule
    if datamodule is not None:
        raise ConfigurationError(
            f"trainer.{call}() got a {type(loaders).__name__} in the dataloaders' place and datamodule="
            f"{type(datamodule).__name__} too. Pass one DataModule (positionally or as datamodule=...)."
        )
    return None, loaders
