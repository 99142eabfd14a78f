"""StochasticWeightAveraging: the model ends with the average of its weights over the last epochs, trained at the
SWA learning rate (torch.optim.swa_utils.SWALR) from the epoch where averaging starts."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import SWALR

from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks.base import Callback
from torchfleet.utilities.types import LRSchedulerConfig

log = logging.getLogger("torchfleet")

AvgFn = Callable[[Tensor, Tensor, Tensor], Tensor]


class StochasticWeightAveraging(Callback):
    """Lightning's callback and arguments: ``swa_lrs`` (a rate, or one per parameter group), ``swa_epoch_start`` (a
    1-based epoch, or a fraction of ``max_epochs``), ``annealing_epochs``, ``annealing_strategy`` ("cos" or
    "linear"), ``avg_fn`` and ``device`` (where the averaged copy lives).

    From the start epoch on, SWALR replaces the Module's scheduler, and at the start of each epoch up to the last the
    weights are added to a running average (as in Lightning, the averaged weights are those the epochs started with:
    the last epoch's own steps are not in it); when fit ends, the model takes the averaged weights. Models with
    batch normalization are refused (Lightning recomputes their statistics in an extra epoch, not done here), as are
    several optimizers or schedulers.
    """

    def __init__(self, swa_lrs: float | list[float], swa_epoch_start: int | float = 0.8, annealing_epochs: int = 10,
                 annealing_strategy: str = "cos", avg_fn: AvgFn | None = None,
                 device: torch.device | str | None = torch.device("cpu")) -> None:  # noqa: B008 - Lightning's default, an immutable device
        if (isinstance(swa_epoch_start, int) and swa_epoch_start < 1) or (
                isinstance(swa_epoch_start, float) and not 0 <= swa_epoch_start <= 1):
            raise ConfigurationError(
                f"StochasticWeightAveraging(swa_epoch_start={swa_epoch_start!r}) is not valid: give the epoch "
                "averaging starts as an int >= 1 (counted from 1) or as a float in [0, 1], a fraction of max_epochs.")
        if not (isinstance(swa_lrs, float) and swa_lrs > 0 or isinstance(swa_lrs, list) and swa_lrs
                and all(isinstance(lr, float) and lr > 0 for lr in swa_lrs)):
            raise ConfigurationError(
                f"StochasticWeightAveraging(swa_lrs={swa_lrs!r}) is not valid: give a positive float, or a list of "
                "positive floats (one per parameter group of the optimizer).")
        if annealing_strategy not in ("cos", "linear"):
            raise ConfigurationError(f"StochasticWeightAveraging(annealing_strategy={annealing_strategy!r}) is not "
                                     "valid: it is 'cos' or 'linear'.")
        if avg_fn is not None and not callable(avg_fn):
            raise ConfigurationError("StochasticWeightAveraging(avg_fn=...) must be callable: "
                                     "avg_fn(averaged, current, num_averaged) -> new average.")
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs, self._annealing_strategy = annealing_epochs, annealing_strategy
        self._avg_fn = avg_fn or self.avg_fn
        self._device = device
        self.n_averaged: Tensor | None = None
        self._average_model: nn.Module | None = None
        self._initialized = False
        self._swa_scheduler: SWALR | None = None
        self._scheduler_state: dict | None = None
        self._init_n_averaged = 0
        self._latest_update_epoch = -1
        self._max_epochs = -1

    @property
    def swa_start(self) -> int:
        """The first epoch (0-based) whose starting weights are averaged."""
        return max(int(self._swa_epoch_start) - 1, 0)

    @property
    def swa_end(self) -> float:
        """The last epoch (0-based) whose starting weights are averaged."""
        return float("inf") if self._max_epochs == -1 else self._max_epochs - 1

    @staticmethod
    def avg_fn(averaged: Tensor, current: Tensor, num_averaged: Tensor) -> Tensor:
        """The running mean: the average of ``num_averaged`` values and ``current``."""
        return averaged + (current - averaged) / (num_averaged + 1)

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        if stage == "fit":
            # the copy shares the Trainer (and what hangs from it) instead of copying it: it holds locks and threads
            self._average_model = copy.deepcopy(module, memo={id(trainer): trainer})

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        if len(trainer.optimizers) != 1:
            raise ConfigurationError(f"StochasticWeightAveraging works with 1 optimizer; configure_optimizers() "
                                     f"returned {len(trainer.optimizers)}.")
        if len(trainer.lr_scheduler_configs) > 1:
            raise ConfigurationError(f"StochasticWeightAveraging replaces 1 learning-rate scheduler; "
                                     f"configure_optimizers() returned {len(trainer.lr_scheduler_configs)}.")
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
            raise ConfigurationError(
                f"StochasticWeightAveraging: {type(module).__name__} has batch normalization, whose statistics would "
                "have to be recomputed for the averaged weights in an extra epoch, which torchfleet does not run yet. "
                "Remove the callback, or use torch.optim.swa_utils.AveragedModel and update_bn yourself.")
        if isinstance(self._swa_epoch_start, float):
            if trainer.max_epochs == -1:
                raise ConfigurationError("StochasticWeightAveraging with swa_epoch_start as a fraction needs "
                                         "max_epochs: with max_epochs=-1 give swa_epoch_start as an int.")
            self._swa_epoch_start = int(trainer.max_epochs * self._swa_epoch_start)
        self._max_epochs = trainer.max_epochs
        if self._scheduler_state is not None and trainer.lr_scheduler_configs:
            trainer.lr_scheduler_configs.clear()  # resumed after SWA began: SWALR comes back below

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        epoch = trainer.current_epoch
        if not self._initialized and self.swa_start <= epoch <= self.swa_end:
            self._start(trainer, module)
        if self.swa_start <= epoch <= self.swa_end and epoch > self._latest_update_epoch:
            assert self.n_averaged is not None and self._average_model is not None
            self.update_parameters(self._average_model, module, self.n_averaged, self._avg_fn)
            self._latest_update_epoch = epoch

    def _start(self, trainer: Any, module: Any) -> None:
        self._initialized = True
        assert self._average_model is not None
        self._average_model = self._average_model.to(self._device or module.device)
        optimizer = trainer.optimizers[0]
        if isinstance(self._swa_lrs, float):
            self._swa_lrs = [self._swa_lrs] * len(optimizer.param_groups)
        for lr, group in zip(self._swa_lrs, optimizer.param_groups):
            group["initial_lr"] = lr
        # as Lightning: the cosine schedule starts from last_epoch=max_epochs
        self._swa_scheduler = SWALR(optimizer, swa_lr=self._swa_lrs, anneal_epochs=self._annealing_epochs,
                                    anneal_strategy=self._annealing_strategy,  # type: ignore[arg-type]
                                    last_epoch=trainer.max_epochs if self._annealing_strategy == "cos" else -1)
        if self._scheduler_state is not None:
            self._swa_scheduler.load_state_dict(self._scheduler_state)
        elif trainer.current_epoch != self.swa_start:
            log.warning("SWA is initializing after swa_start without any checkpoint data.")
        config = LRSchedulerConfig(self._swa_scheduler)
        if trainer.lr_scheduler_configs:
            replaced = trainer.lr_scheduler_configs[0]
            if replaced.interval != "epoch" or replaced.frequency != 1:
                log.warning("SWA is currently only supported every epoch. Found %s", replaced)
            log.info("Swapping scheduler `%s` for `SWALR`", type(replaced.scheduler).__name__)
            trainer.lr_scheduler_configs[0] = config
        else:
            trainer.lr_scheduler_configs.append(config)
        if self.n_averaged is None:
            self.n_averaged = torch.tensor(self._init_n_averaged, dtype=torch.long, device=module.device)

    def on_train_end(self, trainer: Any, module: Any) -> None:
        if (trainer.current_epoch - 1 == self.swa_end or self._max_epochs == -1) and self._average_model is not None:
            self.transfer_weights(self._average_model, module)

    @staticmethod
    def transfer_weights(source: nn.Module, target: nn.Module) -> None:
        """Copy ``source``'s parameters into ``target``'s, in order."""
        for src, dst in zip(source.parameters(), target.parameters()):
            dst.detach().copy_(src.to(dst.device))

    @staticmethod
    def update_parameters(average: nn.Module, model: nn.Module, n_averaged: Tensor, avg_fn: AvgFn) -> None:
        """Add ``model``'s parameters to ``average`` (the first time: copy them) and count them in ``n_averaged``."""
        for p_avg, p_model in zip(average.parameters(), model.parameters()):
            target = p_avg.detach()
            current = p_model.detach().to(target.device)
            target.copy_(current if n_averaged == 0 else avg_fn(target, current, n_averaged.to(target.device)))
        n_averaged += 1

    def state_dict(self) -> dict[str, Any]:
        return {"n_averaged": 0 if self.n_averaged is None else self.n_averaged.item(),
                "latest_update_epoch": self._latest_update_epoch,
                "scheduler_state": None if self._swa_scheduler is None else self._swa_scheduler.state_dict(),
                "average_model_state": None if self._average_model is None else self._average_model.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._init_n_averaged = state_dict["n_averaged"]
        self._latest_update_epoch = state_dict["latest_update_epoch"]
        self._scheduler_state = state_dict["scheduler_state"]
        if self._average_model is not None and state_dict["average_model_state"] is not None:
            self._average_model.load_state_dict(state_dict["average_model_state"])
