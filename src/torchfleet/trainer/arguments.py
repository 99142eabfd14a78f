"""The Trainer's arguments: what one left at None means, and the checks that reject a bad value before anything runs.

``DEFAULTS`` is the one table of what applies when an argument is not given: the Trainer reads it, and
``torchfleet fit --help`` shows it, so the two cannot disagree. Every check raises one paragraph
(``ConfigurationError``) naming the argument, the value given and what is accepted.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from torchfleet.errors import ConfigurationError, check_flag, check_text, not_valid
from torchfleet.precision import DEFAULT_PRECISION

log = logging.getLogger("torchfleet")

#: what a Trainer argument left at None stands for. max_epochs: only when neither max_steps nor max_time is given
#: (else there is no epoch limit); precision: unless a Precision plugin or the strategy object brings one
DEFAULTS: dict[str, Any] = {
    "precision": DEFAULT_PRECISION,
    "max_epochs": 1000,
    "min_epochs": 0,
    "min_steps": 0,
    "limit_train_batches": 1.0,
    "limit_val_batches": 1.0,
    "limit_test_batches": 1.0,
    "limit_predict_batches": 1.0,
    "val_check_interval": 1.0,
    "num_sanity_val_steps": 2,
    "log_every_n_steps": 50,
    "enable_checkpointing": True,
    "enable_progress_bar": True,
    "enable_model_summary": True,
    "gradient_clip_algorithm": "norm",
}


def default(name: str, value: Any) -> Any:
    """``value``, or the default of the Trainer argument ``name`` when it is None."""
    return DEFAULTS[name] if value is None else value


def check_limit(name: str, value: Any) -> int | float:
    """A limit_*_batches / overfit_batches value: an int number of batches or a float fraction."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
        isinstance(value, float) and value > 1.0
    ):
        raise ConfigurationError(
            f"{name}={value!r} is not valid: give an int >= 0 (a number of batches) or a float in [0.0, 1.0] "
            "(a fraction of the dataloader)."
        )
    return value


def parse_val_check_time(value: Any) -> float:
    """Seconds between validations for a val_check_interval given as a duration."""
    from torchfleet.trainer.callbacks.timer import parse_duration

    try:
        seconds = parse_duration(value)
    except ConfigurationError:
        seconds = None
    if not seconds:
        raise ConfigurationError(
            f"val_check_interval={value!r} is not a valid duration: give a string \"DD:HH:MM:SS\" (e.g. "
            "\"00:00:30:00\" validates every 30 minutes), a datetime.timedelta, or a dict of timedelta arguments "
            "such as {\"minutes\": 30}, longer than zero. A float in (0.0, 1.0] or an int number of batches count "
            "batches instead of time."
        )
    return seconds


def note_single_batches(fast_dev_run: int, *given: Any) -> None:
    """Say what an int 1 and a float 1.0 mean for the batch limits, overfit_batches and val_check_interval given.

    An int 1 means one batch where a float 1.0 means the whole epoch (Lightning tells this too, in words its users
    grep for: "`Trainer(limit_train_batches=1)` was configured so ..."); nothing under fast_dev_run, which sets
    them itself."""
    names = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
             "overfit_batches", "val_check_interval")
    for name, value in zip(names, given if not fast_dev_run else ()):
        if isinstance(value, bool) or value != 1:
            continue
        per_epoch = " per epoch" if name == "limit_train_batches" else ""
        if isinstance(value, int):
            if name == "val_check_interval":
                what = "validation will run after every batch (1.0 would run it at the end of each training epoch)"
            else:
                what = f"1 batch{per_epoch} will be used (1.0 would use them all)"
        elif isinstance(value, float):
            if name == "val_check_interval":
                what = "validation will run at the end of the training epoch (an int 1 would run it after every batch)"
            else:
                what = f"100% of the batches{per_epoch} will be used (an int 1 would use one batch)"
        else:
            continue
        log.info("`Trainer(%s=%r)` was configured so %s.", name, value, what)


def check_loop_args(
    fast_dev_run: Any, max_epochs: Any, min_epochs: Any, max_steps: Any, min_steps: Any, val_check_interval: Any,
    check_val_every_n_epoch: Any, log_every_n_steps: Any, num_sanity_val_steps: Any, deterministic: Any,
    val_check_seconds: float | None = None,
) -> None:
    """The arguments that shape the loops: types, ranges, and minimums that do not exceed their maximums.

    ``val_check_seconds``: the period of a val_check_interval given as a duration (then ``val_check_interval`` is
    None)."""

    def positive_int(name: str, value: Any, minimum: int = 1, allow_none: bool = True) -> None:
        if value is None and allow_none:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigurationError(f"{name}={value!r} is not valid: it must be an int >= {minimum}.")

    if not isinstance(fast_dev_run, (bool, int)) or (not isinstance(fast_dev_run, bool) and fast_dev_run < 0):
        raise ConfigurationError(f"fast_dev_run={fast_dev_run!r} is not valid: give True/False or a number of batches.")
    if max_epochs is not None and max_epochs != -1:
        positive_int("max_epochs", max_epochs, 0)
    positive_int("min_epochs", min_epochs, 0)
    if max_steps != -1:
        positive_int("max_steps", max_steps, 0, allow_none=False)
    positive_int("min_steps", min_steps, 0)
    if min_epochs and max_epochs is not None and max_epochs != -1 and min_epochs > max_epochs:
        raise ConfigurationError(
            f"min_epochs={min_epochs} is more than max_epochs={max_epochs}: the run would have to stop before it "
            "may. Give min_epochs <= max_epochs (min_epochs only keeps a callback such as EarlyStopping from "
            "stopping the run earlier)."
        )
    if min_steps and max_steps != -1 and min_steps > max_steps:
        raise ConfigurationError(
            f"min_steps={min_steps} is more than max_steps={max_steps}: the run would have to stop before it may. "
            "Give min_steps <= max_steps (min_steps only keeps a callback such as EarlyStopping from stopping the "
            "run earlier)."
        )
    positive_int("check_val_every_n_epoch", check_val_every_n_epoch)
    positive_int("log_every_n_steps", log_every_n_steps, 0)  # 0: never by steps (as Lightning, and barebones)
    if num_sanity_val_steps is not None and num_sanity_val_steps != -1:
        positive_int("num_sanity_val_steps", num_sanity_val_steps, 0)
    if val_check_interval is not None:
        ok = (isinstance(val_check_interval, float) and 0.0 < val_check_interval <= 1.0) or (
            isinstance(val_check_interval, int) and not isinstance(val_check_interval, bool) and val_check_interval >= 1
        )
        if not ok:
            raise ConfigurationError(
                f"val_check_interval={val_check_interval!r} is not valid: a float in (0.0, 1.0] validates after "
                "that fraction of each training epoch, an int >= 1 after that many training batches."
            )
    if check_val_every_n_epoch is None and val_check_seconds is None and not isinstance(val_check_interval, int):
        # the sentence in backquotes is Lightning's, kept for a ported pytest.raises(match=...)
        raise ConfigurationError(
            "`val_check_interval` should be an integer or a time-based duration (str 'DD:HH:MM:SS', "
            "datetime.timedelta, or dict kwargs for timedelta) when `check_val_every_n_epoch=None`. That setting "
            "validates every val_check_interval training batches counted across epochs (or every so much time), so "
            f"val_check_interval={val_check_interval!r} has no meaning there: give an int number of batches or a "
            f"duration, not {val_check_interval!r} (a fraction of an epoch). Pass val_check_interval=N (an int >= 1) "
            "or a duration, or keep check_val_every_n_epoch=1 to validate at fractions of each epoch."
        )
    if deterministic not in (None, True, False, "warn"):
        raise ConfigurationError(f"deterministic={deterministic!r} is not valid: give True, False or 'warn'.")


#: what barebones=True switches off: the argument, a value that would switch it on, and why it costs speed
_BAREBONES = (
    ("enable_checkpointing", "checkpointing writes files"),
    ("logger", "logging writes files"),
    ("enable_progress_bar", "the progress bar redraws every step"),
    ("enable_model_summary", "the model summary walks the model"),
    ("log_every_n_steps", "logging writes files"),
    ("num_sanity_val_steps", "the sanity check runs validation batches"),
    ("fast_dev_run", "a development run is not a measurement of speed"),
    ("detect_anomaly", "anomaly detection checks every backward"),
    ("profiler", "profiling times every hook"),
)


def barebones_overrides(given: dict[str, Any]) -> dict[str, Any]:
    """The arguments ``barebones=True`` sets, after refusing any of them given a value that switches it on.

    As Lightning's barebones mode: no checkpoints, loggers, progress bar, model summary, sanity check, self.log or
    profiler, so that what remains is the loop's own cost (``bench/overhead.py`` measures it the same way).
    """
    for name, why in _BAREBONES:
        value = given[name]
        if not (value is None or value is False or value == [] or (type(value) is int and value == 0)):
            # "`Trainer(barebones=True, x=v)` was passed" is Lightning's phrase, which ported tests match
            raise ConfigurationError(f"`Trainer(barebones=True, {name}={value!r})` was passed, but barebones mode "
                                     f"switches {name} off: {why}, which the mode leaves out. Remove the argument, "
                                     "or drop barebones=True.")
    log.info("You are running in `Trainer(barebones=True)` mode: checkpointing, loggers, the progress bar, the model "
             "summary, the sanity check, self.log, anomaly detection and profiling are off.")
    return {"enable_checkpointing": False, "logger": False, "enable_progress_bar": False,
            "enable_model_summary": False, "log_every_n_steps": 0, "num_sanity_val_steps": 0}


def check_switches(**switches: Any) -> None:
    """The Trainer's True/False arguments (None, where given as allowed, means the default)."""
    for name, value in switches.items():
        check_flag(name, value, allow_none=name in DEFAULTS)


def check_root_dir(value: Any) -> None:
    """default_root_dir: a folder path, or None for the current directory."""
    check_text("default_root_dir", value, allow_none=True, path=True,
               meaning="the folder for logs and checkpoints; None: the current directory")
    # a folder that does not exist yet is made when the first log or checkpoint is written; a file never becomes one
    if value is not None and os.path.exists(value) and not os.path.isdir(value):
        raise not_valid("default_root_dir", os.fspath(value), "it is a file, not a folder; give the folder for logs "
                        "and checkpoints (made if it does not exist), or None for the current directory")


def check_logger(logger: Any) -> list[Any] | None:
    """The loggers given (None: the default logger; [] for False), or the one-paragraph error."""
    from torchfleet.loggers.base import check_loggers

    if logger is None or logger is True:
        return None
    if logger is False:
        return []
    return check_loggers(logger, "logger", "True or None (the default: a CSVLogger in default_root_dir/logs) or "
                                           "False (no logger)")


def _check_loader(stage: str, name: str, loader: Any) -> None:
    from torch.utils.data import DataLoader, Dataset

    if isinstance(loader, DataLoader):
        return
    if isinstance(loader, Dataset) and not isinstance(loader, Iterable):
        raise not_valid(name, loader, f"trainer.{stage}() takes dataloaders, and this is a Dataset: wrap it, "
                                      f"{name}=DataLoader(dataset, batch_size=...)", f"trainer.{stage}")
    if isinstance(loader, (str, bytes)) or not isinstance(loader, Iterable):
        kind = "train" if name == "train_dataloaders" else "val" if stage in ("fit", "validate") else stage
        raise not_valid(name, loader, "give a torch.utils.data.DataLoader (or any iterable of batches), a list of "
                                      f"them{' for evaluation' if kind != 'train' else ''}, a DataModule, or None to "
                                      f"use the model's or the datamodule's {kind}_dataloader()", f"trainer.{stage}")


def check_stage_args(stage: str, train_dl: Any, eval_dl: Any, datamodule: Any, ckpt_path: Any,
                     kw: dict[str, Any]) -> None:
    """The arguments of fit/validate/test/predict, in the calling process, before any rank starts."""
    from torchfleet.data import DataModule

    if train_dl is not None:
        _check_loader(stage, "train_dataloaders", train_dl)
    if eval_dl is not None:
        name = "val_dataloaders" if stage == "fit" else "dataloaders"
        several = eval_dl.values() if isinstance(eval_dl, Mapping) else eval_dl if isinstance(
            eval_dl, (list, tuple)) else [eval_dl]
        for loader in several:
            _check_loader(stage, name, loader)
    if datamodule is not None and not isinstance(datamodule, DataModule):
        raise not_valid("datamodule", datamodule, "give a torchfleet.DataModule (a LightningDataModule ports by "
                                                  "changing its import and base class) or None", f"trainer.{stage}")
    if ckpt_path is not None and not isinstance(ckpt_path, (str, os.PathLike)):
        raise not_valid("ckpt_path", ckpt_path, "give the path of a checkpoint (a str or pathlib.Path), 'last', "
                                                "'best', or None", f"trainer.{stage}")
    for name in ("verbose", "return_predictions"):
        if name in kw:
            check_flag(name, kw[name], owner=f"trainer.{stage}", allow_none=name == "return_predictions")


def check_callbacks(callbacks: Any) -> list[Any]:
    """The callbacks given, as a list, each a Callback."""
    from torchfleet.trainer.callbacks import Callback

    if callbacks is None:
        return []
    single = isinstance(callbacks, (str, Callback)) or not isinstance(callbacks, Iterable)
    cbs = [callbacks] if single else list(callbacks)
    for cb in cbs:
        if not isinstance(cb, Callback):
            raise ConfigurationError(
                f"callbacks=[...] holds {cb!r} of type {type(cb).__name__}; callbacks must subclass "
                "torchfleet.callbacks.Callback."
            )
    return cbs
