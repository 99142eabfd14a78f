"""Tuner: searches that run the Trainer's own fit to choose a hyperparameter before training."""

from __future__ import annotations

from typing import Any

from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks.batch_size_finder import BatchSizeFinder
from torchfleet.trainer.callbacks.lr_finder import LearningRateFinder, LRFinder

_METHODS = ("fit", "validate", "test", "predict")


class Tuner:
    """``Tuner(trainer)``: Lightning's tuner over one Trainer (the arguments and defaults are Lightning's)."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    def scale_batch_size(self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None,
                         dataloaders: Any = None, datamodule: Any = None, method: str = "fit", mode: str = "power",
                         steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
                         batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192) -> int | None:
        """Find the largest batch size whose trials (``steps_per_trial`` batches of ``method``) run without an
        out-of-memory error, doubling from ``init_val`` ("power"; "binsearch" then bisects and takes ``margin``
        off); the size is written to the model's or DataModule's ``batch_arg_name`` and returned. The dataloaders
        must come from the model or DataModule (they are rebuilt with each size)."""
        _check_arguments(train_dataloaders, val_dataloaders, dataloaders, method)
        if train_dataloaders is not None or val_dataloaders is not None or dataloaders is not None:
            raise ConfigurationError(
                "The batch size finder cannot be used with dataloaders passed directly to the Tuner: each trial "
                "rebuilds the loader with the size it tries. Define train_dataloader() (and the others) on the "
                "model or a DataModule that reads the batch size, and pass the DataModule.")
        trainer = self._trainer
        if any(isinstance(cb, BatchSizeFinder) for cb in trainer.callbacks):
            raise ConfigurationError("Trainer is already configured with a `BatchSizeFinder` callback: remove it "
                                     "if you want to use the Tuner.")
        finder = BatchSizeFinder(mode, steps_per_trial, init_val, max_trials, batch_arg_name, margin, max_val)
        if method == "fit":
            def trial() -> None:
                trainer.fit(model, datamodule=datamodule)
        elif method == "predict":
            def trial() -> None:
                trainer.predict(model, datamodule=datamodule, return_predictions=False)
        else:
            def trial() -> None:
                getattr(trainer, method)(model, datamodule=datamodule, verbose=False)
        finder.scale_batch_size(trainer, model, trial, lambda: _dataset_length(trainer, method), method, datamodule)
        return finder.optimal_batch_size

    def lr_find(self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None,
                dataloaders: Any = None, datamodule: Any = None, method: str = "fit", min_lr: float = 1e-8,
                max_lr: float = 1, num_training: int = 100, mode: str = "exponential",
                early_stop_threshold: float | None = 4.0, update_attr: bool = True,
                attr_name: str = "") -> LRFinder | None:
        """Train ``num_training`` steps with the rate rising from ``min_lr`` to ``max_lr`` and return the
        :class:`LRFinder` (``results``, ``suggestion()``, ``plot()``); with ``update_attr`` the model's ``lr`` (or
        ``learning_rate``, or ``attr_name``) is set to the suggestion. The model's weights, the RNG and the Trainer
        are as before afterwards, so ``trainer.fit(model, ...)`` then trains from the same start."""
        if method != "fit":
            raise ConfigurationError(f"Tuner.lr_find(method={method!r}): method='fit' is the only valid "
                                     "configuration to run the learning rate finder (it trains).")
        _check_arguments(train_dataloaders, val_dataloaders, dataloaders, method)
        trainer = self._trainer
        if any(isinstance(cb, LearningRateFinder) for cb in trainer.callbacks):
            raise ConfigurationError("Trainer is already configured with a `LearningRateFinder` callback: remove "
                                     "it if you want to use the Tuner.")
        finder = LearningRateFinder(min_lr, max_lr, num_training, mode, early_stop_threshold, update_attr, attr_name)
        finder.lr_find(trainer, model, lambda: trainer.fit(model, train_dataloaders, val_dataloaders, datamodule),
                       datamodule)
        return finder.optimal_lr


def _check_arguments(train_dataloaders: Any, val_dataloaders: Any, dataloaders: Any, method: str) -> None:
    if method not in _METHODS:
        raise ConfigurationError(f"method {method!r} is invalid: it is one of {_METHODS}.")
    if method == "fit" and dataloaders is not None:
        raise ConfigurationError(f"In tuner with method={method!r}, `dataloaders` argument should be None, please "
                                 "consider setting `train_dataloaders` and `val_dataloaders` instead.")
    if method != "fit" and (train_dataloaders is not None or val_dataloaders is not None):
        raise ConfigurationError(f"In tuner with `method`={method!r}, `train_dataloaders` and `val_dataloaders` "
                                 "arguments should be None, please consider setting `dataloaders` instead.")


_LOADERS = {"fit": "train_dataloader", "validate": "val_dataloaders", "test": "test_dataloaders",
            "predict": "predict_dataloaders"}


def _dataset_length(trainer: Any, method: str) -> int | None:
    """The samples of the dataset the last trial ran (None before the first, or without a length)."""
    loaders = getattr(trainer, _LOADERS[method], None)
    loaders = loaders if isinstance(loaders, list) else [loaders]
    try:
        return sum(len(loader.dataset) for loader in loaders)
    except (AttributeError, TypeError):
        return None
