"""DataModule: the data of a run — download once, split per stage, and the dataloaders."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sized
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from torchfleet.errors import ConfigurationError
from torchfleet.module import HyperparametersMixin

# the distributed-sampler helpers live in samplers.py; importable from here too
from torchfleet.samplers import ExactDistributedSampler, inject_distributed_sampler

__all__ = ["DataModule", "ExactDistributedSampler", "inject_distributed_sampler"]


class NoDataloader(ConfigurationError, NotImplementedError):
    """A DataModule asked for a stage's dataloader it does not define; the Trainer then uses the model's."""

    def __init__(self, datamodule: Any, method: str) -> None:
        # "must be implemented" is Lightning's phrase, which ported tests match
        super().__init__(f"`{method}` must be implemented to be used with the Trainer: {type(datamodule).__name__} "
                         f"defines no {method}() (nor was it given that stage's dataset in from_datasets).")


class DataModule(HyperparametersMixin):
    """Owns the datasets and returns dataloaders; ``prepare_data`` runs on one process, ``setup`` on all.

    ``self.save_hyperparameters()`` in ``__init__`` records its arguments, as a Module's; the Trainer logs
    them together with the Module's.
    """

    #: a name for the data (Lightning's attribute; None unless a subclass sets one)
    name: str | None = None
    #: ``prepare_data`` runs on local rank 0 of every machine (True) or on global rank 0 only (False)
    prepare_data_per_node: bool = True

    def __init__(self) -> None:
        self.trainer: Any = None

    @classmethod
    def from_datasets(cls, train_dataset: Any = None, val_dataset: Any = None, test_dataset: Any = None,
                      predict_dataset: Any = None, batch_size: int = 1, num_workers: int = 0,
                      **datamodule_kwargs: Any) -> DataModule:
        """A DataModule whose dataloaders read the given datasets (each a Dataset or a list/dict of them).

        Loaders have ``batch_size`` and ``num_workers``; training shuffles map-style datasets. Both numbers also go
        to ``__init__`` where it takes them, with ``datamodule_kwargs``.
        """
        import inspect

        from torch.utils._pytree import tree_map

        def loaders(datasets: Any, shuffle: bool = False) -> Any:
            # pin_memory as Lightning's from_datasets (on a machine without an accelerator torch warns and ignores it)
            return tree_map(lambda ds: DataLoader(ds, batch_size=batch_size,
                                                  shuffle=shuffle and not isinstance(ds, IterableDataset),
                                                  num_workers=num_workers, pin_memory=True)
                            if isinstance(ds, Dataset) else ds, datasets)

        params = inspect.signature(cls.__init__).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        extra = {k: v for k, v in {"batch_size": batch_size, "num_workers": num_workers}.items()
                 if takes_any or k in params}
        datamodule = cls(**datamodule_kwargs, **extra)
        for name, datasets, shuffle in (("train", train_dataset, True), ("val", val_dataset, False),
                                        ("test", test_dataset, False), ("predict", predict_dataset, False)):
            if datasets is not None:
                setattr(datamodule, f"{name}_dataloader", lambda d=datasets, s=shuffle: loaders(d, s))
        return datamodule

    def __str__(self) -> str:
        """The dataloaders each stage gets now, one line a stage (``{Train dataloader: size=64}``): "None" where the
        method is not defined or fails (its stage not set up yet), "NA" for data without a length."""
        lines = []
        for label, method in (("Train", "train_dataloader"), ("Validation", "val_dataloader"),
                              ("Test", "test_dataloader"), ("Predict", "predict_dataloader")):
            lines.append(f"{{{label} dataloader: {_describe_loaders(self, method)}}}")
        return os.linesep.join(lines)

    def prepare_data(self) -> None:
        """Download or write files; runs on one process a machine, or on global rank 0 only with
        ``prepare_data_per_node = False`` (before the others' ``setup``)."""

    def setup(self, stage: str) -> None:
        """Build the datasets for ``stage`` ("fit", "validate", "test" or "predict") on every process."""

    def teardown(self, stage: str) -> None:
        """Release what ``setup`` built."""

    def train_dataloader(self) -> Any:
        raise NoDataloader(self, "train_dataloader")

    def val_dataloader(self) -> Any:
        raise NoDataloader(self, "val_dataloader")

    def test_dataloader(self) -> Any:
        raise NoDataloader(self, "test_dataloader")

    def predict_dataloader(self) -> Any:
        raise NoDataloader(self, "predict_dataloader")

    def state_dict(self) -> dict[str, Any]:
        """State to keep in checkpoints (e.g. a curriculum position)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        """Move ``batch`` to ``device``; overridden here, it replaces the Module's (as in Lightning)."""
        from torchfleet.strategies.utils import move_to_device

        return move_to_device(batch, device)

    def on_exception(self, exception: BaseException) -> None:
        """Called when a stage raises, after the callbacks' ``on_exception``."""

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch


def _describe_loaders(datamodule: DataModule, method: str) -> str:
    """``size=N`` for one DataLoader, ``1. size=N ; 2. size=NA`` for several, "None" where there are none."""
    try:
        loaders = getattr(datamodule, method)()
    except Exception:  # str() must not fail because a stage's data were not set up: that is what it reports
        return "None"

    def size(loader: Any) -> str:
        dataset = getattr(loader, "dataset", None)
        return f"size={len(dataset)}" if isinstance(dataset, Sized) else "size=NA"

    if isinstance(loaders, DataLoader):
        return size(loaders)
    many = list(loaders.values()) if isinstance(loaders, Mapping) else list(loaders)
    return " ; ".join(f"{i}. {size(loader)}" for i, loader in enumerate(many, start=1)) or "None"


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
