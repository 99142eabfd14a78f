"""LearningRateFinder: a short training run with a rising learning rate, and the rate where the loss fell fastest.

The search is one ``trainer.fit`` of its own (``find_lr``): before it, the Trainer's callbacks, loggers, step limit
and sanity check are set aside and the model's weights and the RNG kept; the search callback (``_Search``) sets the
optimizer's rate to ``min_lr`` and puts its scheduler in place of the Module's at ``on_fit_start`` (before the fit
loop reads them), records the rate and the smoothed loss of every step and stops the fit when the loss diverges;
afterwards everything set aside comes back. Every step of it is the Trainer's own, under any strategy.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from torchfleet.errors import ConfigurationError
from torchfleet.seed import isolate_rng
from torchfleet.trainer.callbacks.base import Callback
from torchfleet.utilities.parsing import lightning_hasattr, lightning_setattr
from torchfleet.utilities.types import LRSchedulerConfig

log = logging.getLogger("torchfleet")

MODES = ("linear", "exponential")


class _RisingLR(LRScheduler):
    """From ``base_lr`` towards ``end_lr`` over ``num_iter`` steps; the rate after step k is the one for k + 1
    (Lightning's schedule: its first step already moves two of ``num_iter`` parts)."""

    def __init__(self, optimizer: Any, end_lr: float, num_iter: int, exponential: bool) -> None:
        self.end_lr, self.num_iter, self.exponential = end_lr, num_iter, exponential
        self.lr: list[float] = []
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        if self.last_epoch <= 0:
            rates = list(self.base_lrs)
        else:
            frac = (self.last_epoch + 1) / self.num_iter
            rates = [base * (self.end_lr / base) ** frac if self.exponential else base + frac * (self.end_lr - base)
                     for base in self.base_lrs]
        self.lr = rates
        return rates


class LRFinder:
    """The search's result: ``results["lr"]`` and ``results["loss"]`` (the smoothed loss after each step),
    ``suggestion()`` and ``plot()``."""

    def __init__(self, mode: str, lr_min: float, lr_max: float, num_training: int) -> None:
        self.mode, self.lr_min, self.lr_max, self.num_training = mode, lr_min, lr_max, num_training
        self.results: dict[str, Any] = {}
        self._optimal_idx: int | None = None

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The rate where the loss falls fastest: the steepest negative slope of loss over rate, after leaving out
        the first ``skip_begin`` and last ``skip_end`` points and the non-finite losses; None under 2 points."""
        lrs_all, losses_all = self.results["lr"], self.results["loss"]
        kept = range(len(losses_all))[skip_begin:-skip_end]
        finite = [i for i in kept if math.isfinite(losses_all[i])]
        if len(finite) < 2:
            log.error("Failed to compute suggestion for learning rate because there are not enough points. Increase "
                      "the loop iteration limits or the size of your dataset/dataloader.")
            self._optimal_idx = None
            return None
        losses = torch.tensor([losses_all[i] for i in finite])
        lrs = torch.tensor([lrs_all[i] for i in finite])
        slope = torch.gradient(losses, spacing=[lrs])[0]
        self._optimal_idx = finite[int(torch.argmin(slope).item())]
        return lrs_all[self._optimal_idx]

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """The loss against the rate (log scale in exponential mode), with the suggestion marked; needs matplotlib."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ConfigurationError("LRFinder.plot() draws with matplotlib, which is not installed here: "
                                     "pip install matplotlib, or read finder.results['lr'] and ['loss'].") from None
        fig, ax = plt.subplots() if ax is None else (ax.figure, ax)
        ax.plot(self.results["lr"], self.results["loss"])
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest and self.suggestion() is not None and self._optimal_idx is not None:
            i = self._optimal_idx
            ax.plot(self.results["lr"][i], self.results["loss"][i], markersize=10, marker="o", color="red")
        if show:
            plt.show()
        return fig


class _Search(Callback):
    """The search's only callback: installs the rising rate, records rate and smoothed loss, stops on divergence."""

    def __init__(self, finder: LRFinder, early_stop_threshold: float | None, beta: float = 0.98) -> None:
        self.finder, self.threshold, self.beta = finder, early_stop_threshold, beta
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self.avg_loss = self.best_loss = 0.0
        self.scheduler: _RisingLR | None = None

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        if len(trainer.optimizers) != 1:
            raise ConfigurationError(
                f"The learning rate finder found {len(trainer.optimizers)} optimizers from configure_optimizers(): "
                "it searches the rate of exactly one. Return a single optimizer while you search.")
        optimizer = trainer.optimizers[0]
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] = self.finder.lr_min
        self.scheduler = _RisingLR(optimizer, self.finder.lr_max, self.finder.num_training,
                                   self.finder.mode == "exponential")
        trainer.lr_scheduler_configs = [LRSchedulerConfig(self.scheduler, interval="step")]

    def _window_end(self, trainer: Any, batch_idx: int) -> bool:
        return (batch_idx + 1) % trainer.accumulate_grad_batches == 0

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if self._window_end(trainer, batch_idx):
            assert self.scheduler is not None
            self.lrs.append(self.scheduler.lr[0])

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._window_end(trainer, batch_idx):
            return
        if not outputs:
            self.losses.append(float("nan"))
            return
        loss = (outputs if isinstance(outputs, torch.Tensor) else outputs["loss"]).item()
        step = trainer.global_step
        self.avg_loss = self.beta * self.avg_loss + (1 - self.beta) * loss
        smoothed = self.avg_loss / (1 - self.beta ** (step + 1))
        if self.threshold is not None and step > 1 and smoothed > self.threshold * self.best_loss:
            trainer.should_stop = True
        trainer.should_stop = trainer.strategy.broadcast(trainer.should_stop)
        if smoothed < self.best_loss or step == 1:
            self.best_loss = smoothed
        self.losses.append(smoothed)


def lr_attribute(model: Any, attr_name: str = "", datamodule: Any = None) -> str:
    """The name under which the model (its attribute or hparams) or the DataModule holds the learning rate:
    ``attr_name``, else ``lr`` or ``learning_rate``; a ConfigurationError when there is none."""
    if attr_name:
        if not lightning_hasattr(model, attr_name, datamodule=datamodule):
            raise ConfigurationError(
                f"attr_name={attr_name!r}: the learning rate finder found no attribute {attr_name!r} on "
                f"{type(model).__name__} nor in its hparams. Name the attribute configure_optimizers reads the rate "
                "from, or pass update_attr=False.")
        return attr_name
    for name in ("lr", "learning_rate"):
        if lightning_hasattr(model, name, datamodule=datamodule):
            return name
    raise ConfigurationError(
        f"The learning rate finder sets the rate it finds on the model, but {type(model).__name__} has neither `lr` "
        "nor `learning_rate` (as an attribute or in its hparams). Add one that configure_optimizers reads, name "
        "yours with attr_name=..., or pass update_attr=False.")


def find_lr(trainer: Any, model: Any, run_fit: Callable[[], None], min_lr: float = 1e-8, max_lr: float = 1.0,
            num_training: int = 100, mode: str = "exponential", early_stop_threshold: float | None = 4.0,
            update_attr: bool = True, attr_name: str = "", datamodule: Any = None) -> LRFinder | None:
    """Run the search through ``run_fit()`` (a ``trainer.fit`` of ``model`` on the user's data) and restore what it
    changed; with ``update_attr`` the suggestion is written to the model's rate attribute."""
    if mode not in MODES:
        raise ConfigurationError(f"mode={mode!r} is not valid for the learning rate finder: it is one of {MODES} "
                                 "(how the rate rises from min_lr to max_lr).")
    if not (isinstance(num_training, int) and num_training > 0) or not 0 < min_lr < max_lr:
        raise ConfigurationError(
            f"The learning rate finder needs 0 < min_lr < max_lr and num_training >= 1; got min_lr={min_lr}, "
            f"max_lr={max_lr}, num_training={num_training!r}.")
    if trainer.fast_dev_run:
        log.warning("Skipping learning rate finder since `fast_dev_run` is enabled.")
        return None
    datamodule = datamodule if datamodule is not None else trainer.datamodule
    name = lr_attribute(model, attr_name, datamodule) if update_attr else ""
    finder = LRFinder(mode, min_lr, max_lr, num_training)
    search = _Search(finder, early_stop_threshold)
    kept = {key: getattr(trainer, key) for key in ("callbacks", "max_steps", "limit_val_batches",
                                                    "num_sanity_val_steps", "loggers")}
    weights = copy.deepcopy(model.state_dict())
    try:
        trainer.callbacks, trainer.loggers = [search], []
        trainer.max_steps, trainer.limit_val_batches, trainer.num_sanity_val_steps = num_training, num_training, 0
        with isolate_rng():
            run_fit()
        if trainer.global_step != num_training:
            log.info("LR finder stopped early after %d steps due to diverging loss.", trainer.global_step)
        finder.results = trainer.strategy.broadcast({"lr": search.lrs, "loss": search.losses})
    finally:
        for key, value in kept.items():
            setattr(trainer, key, value)
        trainer.should_stop = False
        model.load_state_dict(weights)
    if update_attr:
        lr = finder.suggestion()
        if lr is not None:
            lightning_setattr(model, name, lr, datamodule=datamodule)
            log.info("Learning rate set to %s", lr)
    return finder


class LearningRateFinder(Callback):
    """Lightning's callback: the arguments of a learning-rate search (``min_lr``, ``max_lr``,
    ``num_training_steps``, ``mode``, ``early_stop_threshold``, ``update_attr``, ``attr_name``).

    Run it with ``torchfleet.tuner.Tuner(trainer).lr_find(model, ...)``, or call ``lr_find(trainer, model,
    run_fit)`` yourself. Given in ``Trainer(callbacks=[...])`` it refuses to start the fit: Lightning searches
    inside that fit and then continues it, which torchfleet's fit loop does not support (see docs/porting.md).
    """

    SUPPORTED_MODES = MODES

    def __init__(self, min_lr: float = 1e-8, max_lr: float = 1, num_training_steps: int = 100,
                 mode: str = "exponential", early_stop_threshold: float | None = 4.0, update_attr: bool = True,
                 attr_name: str = "") -> None:
        mode = mode.lower()
        if mode not in MODES:
            raise ConfigurationError(f"LearningRateFinder(mode={mode!r}) is not valid: it is one of {MODES}.")
        self._min_lr, self._max_lr, self._num_training_steps = min_lr, max_lr, num_training_steps
        self._mode, self._early_stop_threshold = mode, early_stop_threshold
        self._update_attr, self._attr_name = update_attr, attr_name
        self.optimal_lr: LRFinder | None = None

    def lr_find(self, trainer: Any, module: Any, run_fit: Callable[[], None], datamodule: Any = None) -> None:
        """Search with this callback's arguments through ``run_fit`` (a ``trainer.fit`` call); sets ``optimal_lr``."""
        self.optimal_lr = find_lr(trainer, module, run_fit, self._min_lr, self._max_lr, self._num_training_steps,
                                  self._mode, self._early_stop_threshold, self._update_attr, self._attr_name,
                                  datamodule)

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        raise ConfigurationError(
            "LearningRateFinder in Trainer(callbacks=[...]) would search inside this fit and then continue it; "
            "torchfleet searches in a fit of its own: remove the callback and call "
            "torchfleet.tuner.Tuner(trainer).lr_find(model, ...) before trainer.fit(model, ...).")
