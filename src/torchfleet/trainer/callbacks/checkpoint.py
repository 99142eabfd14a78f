"""ModelCheckpoint: save checkpoints periodically, keep the best k by a monitored metric, and last.ckpt."""

from __future__ import annotations

import glob
import logging
import math
import os
import re
import shutil
import time
import typing
import warnings
from datetime import timedelta
from typing import Any, Literal

import torch

from torchfleet.errors import ConfigurationError, check_flag, check_int, check_text, not_valid
from torchfleet.trainer.callbacks.base import Checkpoint
from torchfleet.watchdog import labelled

log = logging.getLogger("torchfleet")

_FIELD = re.compile(r"\{([^{}:!]+)((?:![rsa])?(?::[^{}]*)?)\}")
_LAST = re.compile(r"last(-v\d+)?\.ckpt")


def _resolve_dir(dirpath: str | os.PathLike) -> str:
    """``~`` expanded and, for a local folder, made absolute (as Lightning); a URL (``s3://...``) as given."""
    path = os.path.expanduser(os.fspath(dirpath))
    return path if "://" in path else os.path.realpath(path)


def _check_arguments(given: dict[str, Any]) -> None:
    """ModelCheckpoint's arguments, each of the type and range it accepts (one paragraph for the first that is not)."""
    owner = "ModelCheckpoint"
    check_text("dirpath", given["dirpath"], owner, allow_none=True, path=True)
    check_text("filename", given["filename"], owner, allow_none=True,
               meaning="a template of metric names, epoch and step, e.g. '{epoch}-{val_loss:.2f}'")
    check_text("monitor", given["monitor"], owner, allow_none=True, meaning="the name of a logged metric")
    for name in ("verbose", "save_weights_only", "auto_insert_metric_name", "enable_version_counter",
                 "save_on_exception"):
        check_flag(name, given[name], owner)
    check_flag("save_on_train_epoch_end", given["save_on_train_epoch_end"], owner, allow_none=True)
    save_last = given["save_last"]
    if not (save_last is None or isinstance(save_last, bool) or save_last == "link"):
        raise not_valid("save_last", save_last, "give True (also write last.ckpt), False, None or 'link'", owner)
    # "Must be >= -1" is Lightning's phrase, kept for ported pytest.raises(match=...)
    check_int("save_top_k", given["save_top_k"], -1, owner,
              meaning="-1 keeps every checkpoint, 0 none, k the best k. Must be >= -1")
    check_int("every_n_train_steps", given["every_n_train_steps"], 0, owner, allow_none=True,
              meaning="optimizer steps between saves; 0 or None: not by steps. Must be >= 0")
    check_int("every_n_epochs", given["every_n_epochs"], 0, owner, allow_none=True,
              meaning="epochs between saves; 0: not by epochs. Must be >= 0")
    interval = given["train_time_interval"]
    seconds = interval.total_seconds() if isinstance(interval, timedelta) else interval
    if interval is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0):
        raise not_valid("train_time_interval", interval, "give a datetime.timedelta or a number of seconds, longer "
                                                         "than zero, or None", owner)


class ModelCheckpoint(Checkpoint):
    """Save a checkpoint after validation (or each training epoch, or every n steps), keeping the best ``save_top_k``.

    ``filename`` is a template of logged metric names, ``epoch`` and ``step``, e.g.
    ``"{epoch}-{val_loss:.2f}"`` -> ``epoch=3-val_loss=0.52.ckpt``. Every rank takes the same
    decision (rank 0's monitored value is broadcast); only rank 0 writes and deletes files,
    through the strategy's CheckpointIO.
    """

    FILE_EXTENSION = ".ckpt"
    CHECKPOINT_NAME_LAST = "last"
    #: the first ``-vN`` suffix given to a file name already taken (``epoch=0-step=8-v1.ckpt``, ``last-v1.ckpt``)
    STARTING_VERSION = 1

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | Literal["link"] | None = None,
        save_top_k: int = 1,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: float | timedelta | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
        save_on_exception: bool = False,
    ) -> None:
        _check_arguments(locals())
        if mode not in ("min", "max"):
            raise ConfigurationError(f"ModelCheckpoint(mode={mode!r}) is not valid: `mode` can be 'min' or 'max' but got "
                                     f"{mode}.")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise ConfigurationError(
                f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) is not a valid configuration: save_top_k="
                f"{save_top_k} needs a metric to rank checkpoints by: pass monitor='...'. Without one, save_top_k=1 "
                "keeps the latest and -1 keeps all."
            )
        chosen = [x for x in (every_n_train_steps, train_time_interval, every_n_epochs) if x]
        if len(chosen) > 1:
            raise ConfigurationError(
                "ModelCheckpoint takes one of every_n_train_steps, train_time_interval and every_n_epochs, not several "
                "(Combination of parameters every_n_train_steps, every_n_epochs and train_time_interval is not valid)."
            )
        # as Lightning: "~/ckpts" is the user's home, not a folder named "~"; a local folder is made absolute
        self.dirpath = _resolve_dir(dirpath) if dirpath is not None else None
        self.filename = filename
        self.monitor, self.mode, self.verbose = monitor, mode, verbose
        self.save_last, self.save_top_k, self.save_weights_only = save_last, save_top_k, save_weights_only
        self.auto_insert_metric_name = auto_insert_metric_name
        self.every_n_train_steps = every_n_train_steps or 0
        self.train_time_interval = train_time_interval
        #: seconds between time-based saves (Lightning gives a timedelta; a number of seconds is accepted too)
        self._interval_s = (train_time_interval.total_seconds() if isinstance(train_time_interval, timedelta)
                            else train_time_interval)
        self.every_n_epochs = every_n_epochs if every_n_epochs is not None else (0 if chosen else 1)
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.enable_version_counter = enable_version_counter
        self.save_on_exception = save_on_exception
        self.best_k_models: dict[str, float] = {}
        self.best_model_path = ""
        self.best_model_score: torch.Tensor | None = None
        self.current_score: torch.Tensor | None = None  # the monitored value of the latest top-k save
        self.kth_best_model_path = ""
        self.kth_value: float = math.inf if mode == "min" else -math.inf
        self.last_model_path = ""
        self._last_global_step_saved = -1
        self._last_time: float | None = None  # set when training starts: the interval counts from there
        self._last_checkpoint_saved = ""  # what save_last="link" points last.ckpt at
        self._deferred = False  # a step or time save waits for the validation that logs the monitored value
        self._writes = 0
        self._validated = False  # a validation ran in this fit (a monitored value missing after it is an error)

    # ----------------------------------------------------------------- state
    @property
    def state_key(self) -> str:
        return self._generate_state_key(
            monitor=self.monitor, mode=self.mode, every_n_train_steps=self.every_n_train_steps,
            every_n_epochs=self.every_n_epochs, train_time_interval=self.train_time_interval,
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor, "best_model_score": self.best_model_score, "best_model_path": self.best_model_path,
            "best_k_models": dict(self.best_k_models), "kth_best_model_path": self.kth_best_model_path,
            "kth_value": self.kth_value, "last_model_path": self.last_model_path, "dirpath": self.dirpath,
            "current_score": self.current_score, "last_global_step_saved": self._last_global_step_saved,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:  # a subclass whose state_dict() returns nothing
            return
        if state_dict.get("dirpath") != self.dirpath and self.dirpath is not None:
            # another directory: the old files are not ours to rank or delete; only the best one is remembered
            warnings.warn(
                f"The dirpath has changed from {state_dict.get('dirpath')!r} to {self.dirpath!r}: the checkpoints "
                "there are not ranked or deleted by this callback (best_model_score, kth_best_model_path, kth_value, "
                "last_model_path and best_k_models are not restored); only best_model_path is.", stacklevel=2,
            )
            self.best_model_path = state_dict["best_model_path"]
            return
        self.best_model_score = state_dict["best_model_score"]
        self.best_model_path = state_dict["best_model_path"]
        self.best_k_models = dict(state_dict["best_k_models"])
        self.kth_best_model_path = state_dict["kth_best_model_path"]
        self.kth_value = state_dict["kth_value"]
        self.last_model_path = state_dict["last_model_path"]
        self._last_global_step_saved = state_dict.get("last_global_step_saved", -1)

    # ----------------------------------------------------------------- hooks
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:  # Lightning's argument names
        if self.dirpath is None:
            self.dirpath = _resolve_dir(os.path.join(trainer.log_dir, "checkpoints"))
        if self.save_last == "link" and "://" in self.dirpath:
            raise ConfigurationError(
                f"`ModelCheckpoint(save_last='link')` is only supported for local file paths, got dirpath="
                f"{self.dirpath!r}: a symbolic link needs a local folder. Use save_last=True there (a copy), or a "
                "local dirpath."
            )

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self._last_time = time.monotonic()
        self._validated = False

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._last_global_step_saved or step == 0 or trainer.fast_dev_run:
            return
        due = bool(self.every_n_train_steps) and step % self.every_n_train_steps == 0
        if self.train_time_interval:
            now = time.monotonic()
            elapsed = self._last_time is not None and now - self._last_time >= self._interval_s
            if trainer.strategy.broadcast(elapsed):
                self._last_time = now
                due = True
        if not due:
            return
        if self.monitor is not None and (self.monitor not in self._metrics(trainer) or self._validation_next(trainer)):
            # as Lightning: a monitored value that only validation logs (or that the validation about to run after
            # this batch renews) is saved at that validation's end
            self._deferred = True
            return
        self._save(trainer)

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._validated = True
        if self._skip(trainer) or self._on_train_epoch_end(trainer):
            return
        if self._deferred:
            self._deferred = False
            self._save(trainer)
            return
        self._save(trainer, top_k=self._epoch_due(trainer), last_if_saved=True)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if not self._skip(trainer) and self._on_train_epoch_end(trainer):
            self._save(trainer, top_k=self._epoch_due(trainer), last_if_saved=True)

    def on_train_end(self, trainer: Any, module: Any) -> None:
        # as Lightning: save_last leaves a last.ckpt even when no other save happened in the whole run
        if self.save_last and not self._last_checkpoint_saved and not trainer.fast_dev_run and trainer.global_step:
            self._save_last(trainer, self._metrics(trainer))
            self._notify_loggers(trainer)

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        """With ``save_on_exception=True``: when training raises, save the state it reached (the file the template
        names, and last.ckpt with ``save_last``), atomically as every save; the Trainer then re-raises."""
        if not self.save_on_exception or trainer.state.fn != "fit" or trainer.sanity_checking or self._skip(trainer):
            return
        if trainer.world_size > 1:
            # saving is collective (a barrier, sharded writes): a rank that raised alone would wait for the
            # others, which are in another collective, until the timeout
            log.warning("ModelCheckpoint(save_on_exception=True) saves nothing in a %d-process run: the %s may "
                        "have been raised on this rank alone, and a collective save would then hang.",
                        trainer.world_size, type(exception).__name__)
            return
        assert self.dirpath is not None
        metrics = self._metrics(trainer)
        path = self._unique(trainer, os.path.join(self.dirpath, self.format_checkpoint_name(metrics)), None)
        self._write(trainer, path)
        if self.save_last:
            self._save_last(trainer, metrics)
        self._notify_loggers(trainer)
        log.warning("%s raised at step %d (%s); saved the training state to %s", type(exception).__name__,
                    trainer.global_step, exception, path)

    def _skip(self, trainer: Any) -> bool:
        # as Lightning: nothing is saved under fast_dev_run, outside fit, in the sanity check, nor twice at one step
        return (bool(trainer.fast_dev_run) or trainer.state.fn != "fit" or trainer.sanity_checking
                or trainer.global_step == self._last_global_step_saved)

    def _validation_next(self, trainer: Any) -> bool:
        """Whether validation runs right after this (last) batch of the epoch and this callback saves after it."""
        if not trainer.is_last_batch or self._on_train_epoch_end(trainer) or not any(trainer.num_val_batches):
            return False
        every = trainer.check_val_every_n_epoch
        return every is None or (trainer.current_epoch + 1) % every == 0

    def _epoch_due(self, trainer: Any) -> bool:
        return bool(self.every_n_epochs) and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def _on_train_epoch_end(self, trainer: Any) -> bool:
        """Whether the epoch-based save happens at the training epoch's end rather than after validation.

        Lightning's rule: with validation only every n epochs (``check_val_every_n_epoch != 1``) the save
        follows a validation run, so an epoch without one saves nothing; with no validation, or validation once
        at each epoch's end (``val_check_interval=1.0``, which runs before the epoch-end hooks), it is the training
        epoch's end, which a stop by ``max_steps`` inside the epoch reaches too; with validation several times an
        epoch, each validation.
        """
        if self.save_on_train_epoch_end is not None:
            return self.save_on_train_epoch_end
        if trainer.check_val_every_n_epoch != 1:
            return False
        return not any(trainer.num_val_batches) or trainer.val_check_interval == 1.0

    # ----------------------------------------------------------------- saving
    def _metrics(self, trainer: Any) -> dict[str, Any]:
        metrics = dict(trainer.callback_metrics)
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        return metrics

    def format_checkpoint_name(self, metrics: dict[str, Any], filename: str | None = None) -> str:
        """The file name (with extension) the template gives for ``metrics``."""
        template = filename or self.filename or "{epoch}-{step}"

        def replace(match: re.Match[str]) -> str:
            name, spec = match.group(1), match.group(2)
            value = metrics.get(name, 0)  # as Lightning: a name nothing logged (yet) reads 0
            if isinstance(value, torch.Tensor):
                value = value.item()
            text = format(value, spec[1:] if spec.startswith(":") else "") if value is not None else "None"
            return f"{name}={text}" if self.auto_insert_metric_name else text

        name = _FIELD.sub(replace, template).replace("/", "_")
        return name + self.FILE_EXTENSION

    def _unique(self, trainer: Any, path: str, replacing: str | None) -> str:
        """``path``, or ``path`` with ``-v1``, ``-v2``... when a file of that name exists and is not ``replacing``."""
        if not self.enable_version_counter:
            return path
        exists = self._file_exists(trainer, path)
        version = self.STARTING_VERSION
        base = path[: -len(self.FILE_EXTENSION)]
        while exists and path != replacing:
            path = f"{base}-v{version}{self.FILE_EXTENSION}"
            version += 1
            exists = self._file_exists(trainer, path)
        return path

    @staticmethod
    def _file_exists(trainer: Any, path: str) -> bool:
        """Whether ``path`` exists on global rank 0 (Lightning's vote: the strategy's ``reduce_boolean_decision``)."""
        # only rank 0 looks (a link to a removed file counts: it will be replaced); an "any" vote tells the others
        local = os.path.lexists(path) if trainer.is_global_zero else False
        with labelled("ModelCheckpoint: does the file exist"):
            return trainer.strategy.reduce_boolean_decision(local, all=False)

    def _save(self, trainer: Any, top_k: bool = True, last_if_saved: bool = False) -> None:
        """The top-k (or latest) checkpoint when ``top_k``, then last.ckpt; with ``last_if_saved`` (epoch-end and
        validation saves, as Lightning) last.ckpt only when a checkpoint was written at this step, or to link."""
        metrics = self._metrics(trainer)
        assert self.dirpath is not None
        writes = self._writes
        if top_k and self.save_top_k != 0:
            if self.monitor is None:
                # as Lightning: the latest checkpoint (save_top_k=1 deletes the one before, -1 keeps all);
                # nothing is ranked, so best_k_models stays empty
                previous = self.best_model_path
                path = self._unique(trainer, os.path.join(self.dirpath, self.format_checkpoint_name(metrics)), previous)
                self.best_model_path = self.last_saved = path  # before the write: the file holds its own record
                self._write(trainer, path)
                if self.save_top_k == 1 and previous and self._removable(trainer, previous, path):
                    trainer.strategy.remove_checkpoint(previous)
            else:
                self._save_top_k(trainer, metrics)
        wrote = self._writes != writes
        if self.save_last and (not last_if_saved or wrote or (self.save_last == "link" and self._last_checkpoint_saved)):
            self._save_last(trainer, metrics)
        if wrote or self.save_last:
            self._notify_loggers(trainer)

    def _write(self, trainer: Any, path: str) -> None:
        # set first: the file's own copy of this callback's state then says it was saved at this step
        self._last_checkpoint_saved, self._last_global_step_saved = path, trainer.global_step
        self._writes += 1
        # positionally, as Lightning calls it (a ported test or subclass may wrap trainer.save_checkpoint)
        trainer.save_checkpoint(path, self.save_weights_only)

    def _notify_loggers(self, trainer: Any) -> None:
        # loggers that upload checkpoints (log_model=...) read best_model_path etc., so after the bookkeeping
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.after_save_checkpoint(self)

    def _score(self, trainer: Any, metrics: dict[str, Any]) -> float | None:
        """The monitored value, rank 0's for everyone; None (with a warning) while no validation has run yet."""
        # rank 0's value decides for everyone (also for a value only rank 0 logs: rank_zero_only=True)
        local = metrics.get(self.monitor)
        value = trainer.strategy.broadcast(None if local is None else float(local), src=0)
        if value is None:
            logged = sorted(k for k in metrics if k not in ("epoch", "step"))
            # "could not find the monitored key in the returned metrics" is Lightning's phrase
            text = (f"ModelCheckpoint(monitor={self.monitor!r}) found no metric {self.monitor!r}: it could not find "
                    f"the monitored key in the returned metrics. Logged metrics: {', '.join(logged) or 'none'}. Log "
                    "it with self.log (in validation_step for a validation metric), or change monitor.")
            if not self._validated:  # as Lightning: before any validation ran, a metric it logs may still come
                warnings.warn(text + " No checkpoint is ranked until it is logged.", stacklevel=2)
                return None
            raise ConfigurationError(text)
        return float(value)

    def _better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def _save_top_k(self, trainer: Any, metrics: dict[str, Any]) -> None:
        score = self._score(trainer, metrics)
        if score is None:
            return
        if math.isnan(score):
            # as Lightning: NaN is the worst score there is (+inf in mode min, -inf in mode max)
            score = math.inf if self.mode == "min" else -math.inf
        full = self.save_top_k != -1 and len(self.best_k_models) >= self.save_top_k
        if full and not self._better(score, self.kth_value):
            if self.verbose and trainer.is_global_zero:
                log.info("ModelCheckpoint: %s = %.6g at step %d is not in the top %d; not saved.",
                         self.monitor, score, trainer.global_step, self.save_top_k)
            return
        worst = self.kth_best_model_path if full else None
        if worst is not None:
            self.best_k_models.pop(worst, None)
        path = self._unique(trainer, os.path.join(self.dirpath, self.format_checkpoint_name(metrics)), worst)
        # the ranking is updated before the write, as in Lightning: the file's callback state includes itself
        self.best_k_models[path] = score
        self.current_score = torch.tensor(score)
        ranked = sorted(self.best_k_models.items(), key=lambda kv: kv[1], reverse=self.mode == "max")
        self.best_model_path, best = ranked[0]
        self.best_model_score = torch.tensor(best)
        self.kth_best_model_path, self.kth_value = ranked[-1]
        self._write(trainer, path)
        if worst and self._removable(trainer, worst, path):
            trainer.strategy.remove_checkpoint(worst)
        if self.verbose and trainer.is_global_zero:
            log.info("ModelCheckpoint: %s = %.6g saved to %s", self.monitor, score, path)

    def _save_last(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """``last.ckpt`` (a template of metrics in ``CHECKPOINT_NAME_LAST`` allowed), versioned ``last-v1.ckpt`` when
        another run's is there; with ``save_last="link"`` a link to the checkpoint this callback saved last."""
        assert self.dirpath is not None
        name = self.format_checkpoint_name(metrics, self.CHECKPOINT_NAME_LAST)
        path = self._unique(trainer, os.path.join(self.dirpath, name), self.last_model_path or None)
        previous, self.last_model_path = self.last_model_path, path
        target = self._last_checkpoint_saved
        if self.save_last == "link" and target and self.save_top_k != 0:
            if os.path.abspath(target) != os.path.abspath(path):
                self._link(trainer, target, path)
        else:
            self._write(trainer, path)
        if previous and self._removable(trainer, previous, path):
            trainer.strategy.remove_checkpoint(previous)

    def _removable(self, trainer: Any, previous: str, current: str) -> bool:
        """Whether a file this callback replaces may be deleted: as in Lightning, never the checkpoint the run resumed
        from, nor a file outside ``dirpath`` (a resumed callback's state may name another run's files)."""
        if previous == current:
            return False
        if "://" in previous:
            return True
        resumed = trainer.ckpt_path
        if resumed is not None and os.path.abspath(previous) == os.path.abspath(resumed):
            return False
        folder, path = os.path.abspath(self.dirpath or ""), os.path.abspath(previous)
        return path != folder and os.path.commonpath([folder, path]) == folder

    @staticmethod
    def _link(trainer: Any, target: str, link: str) -> None:
        """Make ``link`` a relative symbolic link to ``target`` on global rank 0 (a copy where links are refused)."""
        if trainer.is_global_zero:
            if os.path.islink(link) or os.path.isfile(link):
                os.remove(link)
            elif os.path.isdir(link):
                shutil.rmtree(link)
            try:
                os.symlink(os.path.relpath(target, os.path.dirname(link)), link)
            except OSError:  # a file system without symbolic links
                (shutil.copytree if os.path.isdir(target) else shutil.copy2)(target, link)
        trainer.strategy.barrier("ModelCheckpoint link")

    # ----------------------------------------------------------------- finding
    @staticmethod
    def find_last(dirpath: str | os.PathLike) -> str | None:
        """The newest of ``last.ckpt``/``last-vN.ckpt`` in ``dirpath`` if one is there, else its newest checkpoint,
        else None (files or sharded directories)."""
        dirpath = os.fspath(dirpath)
        files = [f for f in glob.glob(os.path.join(dirpath, "*" + ModelCheckpoint.FILE_EXTENSION))
                 if not os.path.basename(f).startswith(".") and os.path.exists(f)]
        last = [f for f in files if _LAST.fullmatch(os.path.basename(f))]
        return max(last or files, key=os.path.getmtime) if files else None

    def to_yaml(self, filepath: str | os.PathLike | None = None) -> str:
        """Write ``best_k_models`` (checkpoint path -> score) as YAML; returns the file's path.

        The default file is ``best_k_models.yaml`` in ``dirpath``, which exists once the callback has been set up.
        """
        import yaml

        if filepath is None:
            if self.dirpath is None:
                raise ConfigurationError(
                    "ModelCheckpoint.to_yaml() without a path needs the callback's dirpath, which is decided when "
                    "the Trainer sets the callback up (fit/validate/...). Pass to_yaml(filepath) before that, or "
                    "give ModelCheckpoint(dirpath=...)."
                )
            filepath = os.path.join(self.dirpath, "best_k_models.yaml")
        filepath = os.fspath(filepath)
        with open(filepath, "w", encoding="utf-8") as f:
            yaml.safe_dump({path: float(score) for path, score in self.best_k_models.items()}, f)
        return filepath


# a parser that reads inspect.signature(ModelCheckpoint) itself (argparse with type=annotation, as Lightning's
# tests and some CLIs do) needs the annotations as objects, not the strings the future import leaves
ModelCheckpoint.__init__.__annotations__.update(typing.get_type_hints(ModelCheckpoint.__init__))
