"""ModelCheckpoint: save checkpoints periodically, keep the best k by a monitored metric, and last.ckpt."""

from __future__ import annotations

import glob
import logging
import math
import os
import re
import time
from datetime import timedelta
from typing import Any

import torch

from torchfleet.errors import ConfigurationError, check_flag, check_int, check_text, not_valid
from torchfleet.trainer.callbacks.base import Callback
from torchfleet.watchdog import labelled

log = logging.getLogger("torchfleet")

_FIELD = re.compile(r"\{([^{}:!]+)((?:![rsa])?(?::[^{}]*)?)\}")


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
    check_int("save_top_k", given["save_top_k"], -1, owner, meaning="-1 keeps every checkpoint, 0 none, k the best k")
    check_int("every_n_train_steps", given["every_n_train_steps"], 0, owner, allow_none=True,
              meaning="optimizer steps between saves; 0 or None: not by steps")
    check_int("every_n_epochs", given["every_n_epochs"], 0, owner, allow_none=True,
              meaning="epochs between saves; 0: not by epochs")
    interval = given["train_time_interval"]
    seconds = interval.total_seconds() if isinstance(interval, timedelta) else interval
    if interval is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0):
        raise not_valid("train_time_interval", interval, "give a datetime.timedelta or a number of seconds, longer "
                                                         "than zero, or None", owner)


class ModelCheckpoint(Callback):
    """Save a checkpoint after validation (or each training epoch, or every n steps), keeping the best ``save_top_k``.

    ``filename`` is a template of logged metric names, ``epoch`` and ``step``, e.g.
    ``"{epoch}-{val_loss:.2f}"`` -> ``epoch=3-val_loss=0.52.ckpt``. Every rank takes the same
    decision (rank 0's monitored value is broadcast); only rank 0 writes and deletes files,
    through the strategy's CheckpointIO.
    """

    FILE_EXTENSION = ".ckpt"
    CHECKPOINT_NAME_LAST = "last"

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | None = None,
        save_top_k: int = 1,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: float | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
        save_on_exception: bool = False,
    ) -> None:
        _check_arguments(locals())
        if mode not in ("min", "max"):
            raise ConfigurationError(f"ModelCheckpoint(mode={mode!r}) is not valid: use 'min' or 'max'.")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise ConfigurationError(
                f"ModelCheckpoint(save_top_k={save_top_k}) needs a metric to rank checkpoints by: pass monitor='...'. "
                "Without one, save_top_k=1 keeps the latest and -1 keeps all."
            )
        chosen = [x for x in (every_n_train_steps, train_time_interval, every_n_epochs) if x]
        if len(chosen) > 1:
            raise ConfigurationError(
                "ModelCheckpoint takes one of every_n_train_steps, train_time_interval and every_n_epochs, not several."
            )
        # as Lightning: "~/ckpts" is the user's home, not a folder named "~"
        self.dirpath = os.path.expanduser(os.fspath(dirpath)) if dirpath is not None else None
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
        self._last_time = time.monotonic()

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
        if state_dict.get("dirpath") != self.dirpath and self.dirpath is not None:
            # another directory: the old files are not ours to rank or delete
            return
        self.best_model_score = state_dict["best_model_score"]
        self.best_model_path = state_dict["best_model_path"]
        self.best_k_models = dict(state_dict["best_k_models"])
        self.kth_best_model_path = state_dict["kth_best_model_path"]
        self.kth_value = state_dict["kth_value"]
        self.last_model_path = state_dict["last_model_path"]
        self._last_global_step_saved = state_dict.get("last_global_step_saved", -1)

    # ----------------------------------------------------------------- hooks
    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.join(trainer.log_dir, "checkpoints")

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._last_global_step_saved or step == 0 or trainer.fast_dev_run:
            return
        due = bool(self.every_n_train_steps) and step % self.every_n_train_steps == 0
        if self.train_time_interval:
            now = time.monotonic()
            elapsed = trainer.strategy.broadcast(now - self._last_time >= self._interval_s)
            if elapsed:
                self._last_time = now
                due = True
        if due:
            self._save(trainer)

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        if trainer.sanity_checking or trainer.stage != "fit" or self.every_n_train_steps or self.train_time_interval:
            return
        if self._skip(trainer) or self._on_train_epoch_end(trainer) or not self._epoch_due(trainer):
            return
        self._save(trainer)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if self.every_n_train_steps or self.train_time_interval or not self._epoch_due(trainer):
            return
        if not self._skip(trainer) and self._on_train_epoch_end(trainer):
            self._save(trainer)

    def on_train_end(self, trainer: Any, module: Any) -> None:
        # a run that stops between periodic saves still leaves its last state behind
        if self.save_last and not self._skip(trainer) and trainer.global_step > 0:
            self._save_last(trainer)
            self._notify_loggers(trainer)

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        """With ``save_on_exception=True``: when training raises, save the state it reached (the file the template
        names, and last.ckpt with ``save_last``), atomically as every save; the Trainer then re-raises."""
        if not self.save_on_exception or trainer.stage != "fit" or trainer.sanity_checking or self._skip(trainer):
            return
        if trainer.world_size > 1:
            # saving is collective (a barrier, sharded writes): a rank that raised alone would wait for the
            # others, which are in another collective, until the timeout
            log.warning("ModelCheckpoint(save_on_exception=True) saves nothing in a %d-process run: the %s may "
                        "have been raised on this rank alone, and a collective save would then hang.",
                        trainer.world_size, type(exception).__name__)
            return
        assert self.dirpath is not None
        path = self._unique(trainer, os.path.join(self.dirpath, self.format_checkpoint_name(self._metrics(trainer))),
                            None)
        self._write(trainer, path)
        self._last_global_step_saved = trainer.global_step
        if self.save_last:
            self._save_last(trainer)
        self._notify_loggers(trainer)
        log.warning("%s raised at step %d (%s); saved the training state to %s", type(exception).__name__,
                    trainer.global_step, exception, path)

    def _skip(self, trainer: Any) -> bool:
        # as Lightning: nothing is saved under fast_dev_run, nor twice at one step
        return bool(trainer.fast_dev_run) or trainer.global_step == self._last_global_step_saved

    def _epoch_due(self, trainer: Any) -> bool:
        return bool(self.every_n_epochs) and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def _on_train_epoch_end(self, trainer: Any) -> bool:
        """Whether the epoch-based save happens at the training epoch's end rather than after validation.

        Lightning's rule: with validation only every n epochs (``check_val_every_n_epoch != 1``) the save
        follows a validation run, so an epoch without one saves nothing; with no validation at all it is the
        training epoch's end. (Validation at each epoch's end saves after it, in that same epoch.)
        """
        if self.save_on_train_epoch_end is not None:
            return self.save_on_train_epoch_end
        if trainer.check_val_every_n_epoch != 1:
            return False
        return not any(trainer.num_val_batches)

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
            value = metrics.get(name)
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
        version = 1
        base = path[: -len(self.FILE_EXTENSION)]
        while exists and path != replacing:
            path = f"{base}-v{version}{self.FILE_EXTENSION}"
            version += 1
            exists = self._file_exists(trainer, path)
        return path

    @staticmethod
    def _file_exists(trainer: Any, path: str) -> bool:
        """Whether ``path`` exists on any rank (Lightning's vote, the strategy's ``reduce_boolean_decision``)."""
        with labelled("ModelCheckpoint: does the file exist"):
            return trainer.strategy.reduce_boolean_decision(os.path.exists(path), all=False)

    def _save(self, trainer: Any) -> None:
        metrics = self._metrics(trainer)
        assert self.dirpath is not None
        if self.save_top_k != 0:
            if self.monitor is None:
                # as Lightning: the latest checkpoint (save_top_k=1 deletes the one before, -1 keeps all);
                # nothing is ranked, so best_k_models stays empty
                previous = self.best_model_path
                path = self._unique(trainer, os.path.join(self.dirpath, self.format_checkpoint_name(metrics)), previous)
                self._write(trainer, path)
                self.best_model_path = self.last_saved = path
                if self.save_top_k == 1 and previous and previous != path:
                    trainer.strategy.remove_checkpoint(previous)
            else:
                self._save_top_k(trainer, metrics)
        self._last_global_step_saved = trainer.global_step
        if self.save_last:
            self._save_last(trainer)
        self._notify_loggers(trainer)

    def _write(self, trainer: Any, path: str) -> None:
        trainer.save_checkpoint(path, weights_only=self.save_weights_only)

    def _notify_loggers(self, trainer: Any) -> None:
        # loggers that upload checkpoints (log_model=...) read best_model_path etc., so after the bookkeeping
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.after_save_checkpoint(self)

    def _score(self, trainer: Any, metrics: dict[str, Any]) -> float:
        # rank 0's value decides for everyone (also for a value only rank 0 logs: rank_zero_only=True)
        local = metrics.get(self.monitor)
        value = trainer.strategy.broadcast(None if local is None else float(local), src=0)
        if value is None:
            logged = sorted(k for k in metrics if k not in ("epoch", "step"))
            raise ConfigurationError(
                f"ModelCheckpoint(monitor={self.monitor!r}) found no metric {self.monitor!r}. Logged metrics: "
                f"{', '.join(logged) or 'none'}. Log it with self.log (in validation_step for a validation metric), "
                "or change monitor."
            )
        return float(value)

    def _better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def _save_top_k(self, trainer: Any, metrics: dict[str, Any]) -> None:
        score = self._score(trainer, metrics)
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
        self._write(trainer, path)
        self.best_k_models[path] = score
        self.current_score = torch.tensor(score)
        if worst and worst != path:
            trainer.strategy.remove_checkpoint(worst)
        ranked = sorted(self.best_k_models.items(), key=lambda kv: kv[1], reverse=self.mode == "max")
        self.best_model_path, best = ranked[0]
        self.best_model_score = torch.tensor(best)
        self.kth_best_model_path, self.kth_value = ranked[-1]
        if self.verbose and trainer.is_global_zero:
            log.info("ModelCheckpoint: %s = %.6g saved to %s", self.monitor, score, path)

    def _save_last(self, trainer: Any) -> None:
        assert self.dirpath is not None
        path = os.path.join(self.dirpath, self.CHECKPOINT_NAME_LAST + self.FILE_EXTENSION)
        self._write(trainer, path)
        self.last_model_path = path
        self._last_global_step_saved = trainer.global_step

    # ----------------------------------------------------------------- finding
    @staticmethod
    def find_last(dirpath: str | os.PathLike) -> str | None:
        """``last.ckpt`` in ``dirpath`` if present, else its newest checkpoint, else None (files or sharded directories)."""
        dirpath = os.fspath(dirpath)
        last = os.path.join(dirpath, ModelCheckpoint.CHECKPOINT_NAME_LAST + ModelCheckpoint.FILE_EXTENSION)
        if os.path.exists(last):
            return last
        files = [f for f in glob.glob(os.path.join(dirpath, "*" + ModelCheckpoint.FILE_EXTENSION))
                 if not os.path.basename(f).startswith(".")]
        return max(files, key=os.path.getmtime) if files else None

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
