"""Tuner: searches that run the Trainer's own fit to choose a hyperparameter before training."""

from __future__ import annotations

from typing import Any

from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks.lr_finder import LearningRateFinder, LRFinder

_METHODS = ("fit", "validate", "test", "predict")


class Tuner:
    """``Tuner(trainer)``: Lightning's tuner over one Trainer (the arguments and defaults are Lightning's)."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

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
        finder.lr_find(trainer, model, lambda: trainer.fit(model, train_dataloaders, val_dataloaders, datamodule))
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
