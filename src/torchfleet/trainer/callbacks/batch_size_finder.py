"""BatchSizeFinder: the largest batch size that runs without running out of memory, found by short trial runs.

Each trial is one run of the stage being tuned (``trainer.fit``, ``validate``, ``test`` or ``predict``: the
``run_trial`` the Tuner passes in) with ``steps_per_trial`` batches, no callbacks, no loggers and no sanity check;
between trials the size is written where the Module or DataModule keeps it (``batch_arg_name``), so the next run's
dataloader is built with it. A trial that raises an out-of-memory error shrinks the size; any other error goes to
the caller. Afterwards the weights and the Trainer's settings are as before. As in Lightning, the trials draw from
the global RNG (a shuffled loader, dropout), so the run that follows starts from the RNG they left.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks.base import Callback
from torchfleet.utilities.parsing import lightning_getattr, lightning_hasattr, lightning_setattr

log = logging.getLogger("torchfleet")

MODES = ("power", "binsearch")
_OOM_WORDS = (("CUDA", "out of memory"), ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",),
              ("DefaultCPUAllocator: can't allocate memory",))


def is_oom_error(exception: BaseException) -> bool:
    """Whether ``exception`` is the RuntimeError torch raises when an allocation fails (CUDA, cuDNN, CPU)."""
    if not isinstance(exception, RuntimeError) or len(exception.args) != 1 or not isinstance(exception.args[0], str):
        return False
    return any(all(word in exception.args[0] for word in words) for words in _OOM_WORDS)


class _Trials:
    """The search's state: the size now set, how to run a trial, and the dataset length that caps the size."""

    def __init__(self, model: Any, datamodule: Any, name: str, run_trial: Callable[[], None],
                 dataset_length: Callable[[], int | None], max_val: int) -> None:
        self.model, self.datamodule, self.name = model, datamodule, name
        self.run_trial, self.dataset_length, self.max_val = run_trial, dataset_length, max_val
        #: the size the loader was built with before the search: Lightning's first trial runs its loader, built
        #: before the search started, so that trial runs at this size whatever ``init_val`` says (kept here for
        #: its numbers: the trials' draws from the RNG decide the run that follows)
        self.first_size: Any = lightning_getattr(model, name, datamodule=datamodule)

    def adjust(self, factor: float = 1.0, value: int | None = None, desc: str | None = None) -> tuple[int, bool]:
        """Set the next size (``value``, or the current one times ``factor``, at most ``max_val``); unchanged when
        the current size already covers the whole dataset."""
        size = lightning_getattr(self.model, self.name, datamodule=self.datamodule)
        length = self.dataset_length()
        if length is not None and size >= length:
            log.info("The batch size %d is greater or equal than the length of your dataset: %d.", size, length)
            return size, False
        new = value if value is not None else int(size * factor)
        if new > self.max_val:
            if desc:
                log.info("Batch size %d exceeds max_val limit %d, capping at %d", new, self.max_val, self.max_val)
            new = self.max_val
        if desc:
            log.info("Batch size %d %s, trying batch size %d", size, desc, new)
        lightning_setattr(self.model, self.name, new, datamodule=self.datamodule)
        return new, new != size

    def fits(self) -> bool:
        """Run one trial: True when it ran, False when it ran out of memory."""
        size, first = lightning_getattr(self.model, self.name, datamodule=self.datamodule), self.first_size
        self.first_size = None
        try:
            if first is not None:
                lightning_setattr(self.model, self.name, first, datamodule=self.datamodule)
            self.run_trial()
        except RuntimeError as exc:
            if not is_oom_error(exc):
                raise
            return False
        finally:
            lightning_setattr(self.model, self.name, size, datamodule=self.datamodule)
        return True


def _power(trials: _Trials, size: int, max_trials: int) -> int:
    any_success = False
    last_good = size
    for i in range(max_trials):
        if size >= trials.max_val:
            log.info("Reached the maximum batch size limit of %d. Stopping search.", trials.max_val)
            break
        if trials.fits():
            last_good = size
            if i + 1 >= max_trials:
                size = last_good
                break
            size, changed = trials.adjust(factor=2.0, desc="succeeded")
            if not changed:
                break
            any_success = True
        else:
            size, _ = trials.adjust(factor=0.5, desc="failed")
            if any_success:
                break
    return size


def _binsearch(trials: _Trials, size: int, max_trials: int, margin: float) -> int:
    low, high, count, last_good = 1, None, 0, size
    while True:
        if size >= trials.max_val:
            log.info("Reached the maximum batch size limit of %d. Stopping search.", trials.max_val)
            break
        if trials.fits():
            last_good = size
            count += 1
            if count >= max_trials:
                size = last_good
                break
            low = size
            if high:
                if high - low <= 1:
                    break
                size, changed = trials.adjust(value=(high + low) // 2, desc="succeeded")
            else:
                size, changed = trials.adjust(factor=2.0, desc="succeeded")
            if not changed:
                break
        else:
            high = size
            size, _ = trials.adjust(value=(high + low) // 2, desc="failed")
            if high - low <= 1:
                break
    if margin > 0:
        reduced = max(1, int(size * (1 - margin)))
        if reduced != size:
            log.info("Applying margin of %.1f%%, reducing batch size from %d to %d", margin * 100, size, reduced)
            size = reduced
            lightning_setattr(trials.model, trials.name, size, datamodule=trials.datamodule)
    return size


def scale_batch_size(trainer: Any, model: Any, run_trial: Callable[[], None], dataset_length: Callable[[], int | None],
                     stage: str = "fit", datamodule: Any = None, mode: str = "power", steps_per_trial: int = 3,
                     init_val: int = 2, max_trials: int = 25, batch_arg_name: str = "batch_size",
                     margin: float = 0.05, max_val: int = 8192) -> int | None:
    """Search the batch size by trials of ``run_trial()`` (one run of ``stage``); returns it, written to the model's
    (or DataModule's) ``batch_arg_name``."""
    if trainer.fast_dev_run:
        log.warning("Skipping batch size scaler since `fast_dev_run` is enabled.")
        return None
    limit = {"fit": "limit_val_batches", "validate": "limit_val_batches", "test": "limit_test_batches",
             "predict": "limit_predict_batches"}[stage]
    names = ["callbacks", "loggers", "num_sanity_val_steps", limit]
    if stage == "fit":
        names += ["max_steps", "limit_train_batches"]
    kept = {key: getattr(trainer, key) for key in names}
    weights = copy.deepcopy(model.state_dict())
    try:
        trainer.callbacks, trainer.loggers, trainer.num_sanity_val_steps = [], [], 0
        setattr(trainer, limit, steps_per_trial)
        if stage == "fit":
            trainer.max_steps, trainer.limit_train_batches = steps_per_trial, 1.0
        trials = _Trials(model, datamodule, batch_arg_name, run_trial, dataset_length, max_val)
        size, _ = trials.adjust(value=init_val)
        size = _power(trials, size, max_trials) if mode == "power" else _binsearch(trials, size, max_trials, margin)
        log.info("Finished batch size finder, will continue with full run using batch size %d", size)
    finally:
        for key, value in kept.items():
            setattr(trainer, key, value)
        trainer.should_stop = False
        model.load_state_dict(weights)
        if stage == "fit":
            _iterator_seed(trainer.train_dataloader)
    return size


def _iterator_seed(loader: Any) -> None:
    """Start an iterator of the training loader and fetch its first batch, then drop it. Lightning's search ends by
    preparing the training loader for the run that follows, which starts its iterator and prefetches a batch: the
    numbers that draws from the global RNG (the iterator's base seed, a random sampler's seed) are drawn here too,
    so the fit that follows shuffles as it does under Lightning."""
    if isinstance(loader, DataLoader):
        next(iter(loader), None)


class BatchSizeFinder(Callback):
    """Lightning's callback: the arguments of a batch-size search (``mode`` "power" or "binsearch",
    ``steps_per_trial``, ``init_val``, ``max_trials``, ``batch_arg_name``, ``margin``, ``max_val``).

    Run it with ``torchfleet.tuner.Tuner(trainer).scale_batch_size(model, ...)``. Given in ``Trainer(callbacks=[...])``
    it refuses to start the stage: Lightning searches inside that stage and then continues it, which torchfleet's
    loops do not support (docs/porting.md).
    """

    SUPPORTED_MODES = MODES

    def __init__(self, mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
                 batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192) -> None:
        mode = mode.lower()
        if mode not in MODES:
            raise ConfigurationError(f"BatchSizeFinder(mode={mode!r}) is not valid: it is one of {MODES} (double "
                                     "until a trial fails, or then bisect between the last good and the failed size).")
        if not 0.0 <= margin < 1.0:
            raise ConfigurationError(f"BatchSizeFinder(margin={margin!r}) is not valid: it is a fraction in [0, 1) "
                                     "taken off the size found (binsearch mode).")
        self.optimal_batch_size: int | None = init_val
        self._mode, self._steps_per_trial, self._init_val = mode, steps_per_trial, init_val
        self._max_trials, self._batch_arg_name, self._margin, self._max_val = max_trials, batch_arg_name, margin, max_val

    def check(self, trainer: Any, model: Any, datamodule: Any) -> None:
        """Refuse what the search cannot do: several processes, or a model without the batch size attribute."""
        if trainer.world_size > 1:
            raise ConfigurationError("The batch size finder is not supported with distributed strategies: run it in "
                                     "one process (a size that fits one device fits each of them).")
        if not lightning_hasattr(model, self._batch_arg_name, datamodule=datamodule):
            raise ConfigurationError(
                f"Field {self._batch_arg_name} not found in `model`, `datamodule`, nor their `hparams` attributes: "
                "the batch size finder writes the size there for the dataloader to read. Add it, or name yours "
                "with batch_arg_name=...")

    def scale_batch_size(self, trainer: Any, model: Any, run_trial: Callable[[], None],
                         dataset_length: Callable[[], int | None], stage: str = "fit", datamodule: Any = None) -> None:
        """Search with this callback's arguments; sets ``optimal_batch_size``."""
        self.check(trainer, model, datamodule)
        self.optimal_batch_size = scale_batch_size(
            trainer, model, run_trial, dataset_length, stage, datamodule, self._mode, self._steps_per_trial,
            self._init_val, self._max_trials, self._batch_arg_name, self._margin, self._max_val)

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        raise ConfigurationError(
            "BatchSizeFinder in Trainer(callbacks=[...]) would search inside this run and then continue it; "
            "torchfleet searches in runs of its own: remove the callback and call "
            "torchfleet.tuner.Tuner(trainer).scale_batch_size(model, ...) before trainer.fit(model, ...).")
