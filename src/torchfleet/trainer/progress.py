"""``trainer.fit_loop`` and the evaluation loops' counters, in the shape Lightning's callbacks read them.

The progress classes are Lightning's (``ready``/``started``/``processed``/``completed``, ``total`` and ``current``).
The training counters are a view over the Trainer's RunState, built when asked for: the fit loop keeps plain
counters in its hot path and pays nothing for this. The evaluation loops' batch counters are kept by the
evaluation loop itself (a few integer increments per evaluation batch).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchfleet.trainer.loop_trainer import LoopTrainer


# ---------------------------------------------------------------------------- Lightning's progress classes
@dataclass
class BaseProgress:
    """A dataclass of counters that saves to, and loads from, a plain dict."""

    def state_dict(self) -> dict:
        """The counters as nested plain dicts."""
        return asdict(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """Take the counters of ``state_dict`` (as ``state_dict()`` gave them)."""
        self.__dict__.update(state_dict)

    @classmethod
    def from_state_dict(cls, state_dict: dict) -> BaseProgress:
        """A new instance holding ``state_dict``'s counters."""
        obj = cls()
        obj.load_state_dict(state_dict)
        return obj

    def reset(self) -> None:
        """All counters back to zero."""
        raise NotImplementedError


@dataclass
class ReadyCompletedTracker(BaseProgress):
    """How many events were ready to start and how many completed (increased in that order)."""

    ready: int = 0
    completed: int = 0

    def reset(self) -> None:
        """Every counter back to zero."""
        for f in fields(self):
            setattr(self, f.name, 0)

    def reset_on_restart(self) -> None:
        """After a failure: the counters fall back to the last completed event."""
        for f in fields(self):
            setattr(self, f.name, self.completed)

    def increment_by(self, n: int) -> None:
        """``n`` events ran whole."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + n)


@dataclass
class StartedTracker(ReadyCompletedTracker):
    """``ready``, ``started`` (after the event's start hook) and ``completed``."""

    started: int = 0


@dataclass
class ProcessedTracker(StartedTracker):
    """``ready``, ``started``, ``processed`` (its step ran) and ``completed`` (its end hooks ran)."""

    processed: int = 0


@dataclass
class Progress(BaseProgress):
    """``total`` counts the whole run (resumed runs included); ``current`` since the enclosing loop last began."""

    total: ReadyCompletedTracker = field(default_factory=ProcessedTracker)
    current: ReadyCompletedTracker = field(default_factory=ProcessedTracker)

    def __post_init__(self) -> None:
        if self.total.__class__ is not self.current.__class__:
            raise ValueError(
                f"Progress(total, current): the `total` and `current` instances should be of the same class; got "
                f"{type(self.total).__name__} and {type(self.current).__name__}."
            )

    def _has(self, name: str, kind: type) -> None:
        if not isinstance(self.total, kind):
            raise TypeError(f"`{type(self.total).__name__}` doesn't have a `{name}` attribute: use a "
                            f"{kind.__name__} (or ProcessedTracker) to count it.")

    def increment_ready(self) -> None:
        """One more event is ready."""
        self.total.ready += 1
        self.current.ready += 1

    def increment_started(self) -> None:
        """One more event started."""
        self._has("started", StartedTracker)
        self.total.started += 1  # type: ignore[attr-defined]
        self.current.started += 1  # type: ignore[attr-defined]

    def increment_processed(self) -> None:
        """One more event was processed."""
        self._has("processed", ProcessedTracker)
        self.total.processed += 1  # type: ignore[attr-defined]
        self.current.processed += 1  # type: ignore[attr-defined]

    def increment_completed(self) -> None:
        """One more event completed."""
        self.total.completed += 1
        self.current.completed += 1

    @classmethod
    def from_defaults(cls, tracker_cls: type[ReadyCompletedTracker], **kwargs: int) -> Progress:
        """``total`` and ``current`` both ``tracker_cls(**kwargs)``."""
        return cls(total=tracker_cls(**kwargs), current=tracker_cls(**kwargs))

    def reset(self) -> None:
        """Both trackers back to zero."""
        self.total.reset()
        self.current.reset()

    def reset_on_run(self) -> None:
        """The enclosing loop begins again: ``current`` back to zero."""
        self.current.reset()

    def reset_on_restart(self) -> None:
        """After a failure: ``current`` falls back to its last completed event."""
        self.current.reset_on_restart()

    def increment_by(self, n: int) -> None:
        """``n`` events ran whole."""
        self.total.increment_by(n)
        self.current.increment_by(n)

    def load_state_dict(self, state_dict: dict) -> None:
        """Take the counters of ``state_dict``."""
        self.total.load_state_dict(state_dict["total"])
        self.current.load_state_dict(state_dict["current"])


@dataclass
class BatchProgress(Progress):
    """Batches of one rank (not synchronised across ranks); ``is_last_batch`` for data without a length."""

    is_last_batch: bool = False

    def reset(self) -> None:
        """Every counter back to zero."""
        super().reset()
        self.is_last_batch = False

    def reset_on_run(self) -> None:
        """The loop begins again: ``current`` back to zero."""
        super().reset_on_run()
        self.is_last_batch = False

    def increment_by(self, n: int, is_last_batch: bool = False) -> None:
        """``n`` batches ran whole."""
        super().increment_by(n)
        self.is_last_batch = is_last_batch

    def load_state_dict(self, state_dict: dict) -> None:
        """Take the counters of ``state_dict``."""
        super().load_state_dict(state_dict)
        self.is_last_batch = state_dict["is_last_batch"]


def _ready_completed() -> Progress:
    return Progress.from_defaults(ReadyCompletedTracker)


def _started() -> Progress:
    return Progress.from_defaults(StartedTracker)


@dataclass
class _Composite(BaseProgress):
    """Progress made of other progress objects (its fields): each method applies to every part."""

    def _parts(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self)]

    def reset(self) -> None:
        """Every counter back to zero."""
        for part in self._parts():
            part.reset()

    def reset_on_run(self) -> None:
        """The epoch begins: ``current`` back to zero."""
        for part in self._parts():
            part.reset_on_run()

    def reset_on_restart(self) -> None:
        """After a failure: back to the last completed call."""
        for part in self._parts():
            part.reset_on_restart()

    def load_state_dict(self, state_dict: dict) -> None:
        """Take the counters of ``state_dict``."""
        for f in fields(self):
            getattr(self, f.name).load_state_dict(state_dict[f.name])


@dataclass
class OptimizerProgress(_Composite):
    """``optimizer.step`` and ``optimizer.zero_grad`` calls."""

    step: Progress = field(default_factory=_ready_completed)
    zero_grad: Progress = field(default_factory=_started)


@dataclass
class OptimizationProgress(_Composite):
    """The optimizer's progress; ``optimizer_steps`` is the number of steps taken (``trainer.global_step``)."""

    optimizer: OptimizerProgress = field(default_factory=OptimizerProgress)

    @property
    def optimizer_steps(self) -> int:
        return self.optimizer.step.total.completed


# ---------------------------------------------------------------------------- the loops' views
def _same(done: int, running: bool = False, cls: type[ReadyCompletedTracker] = ProcessedTracker) -> Any:
    counts = {"ready": done + running, "completed": done}
    if issubclass(cls, StartedTracker):
        counts["started"] = done + running
    if issubclass(cls, ProcessedTracker):
        counts["processed"] = done
    return cls(**counts)


def _progress(total: int, current: int, cls: type[ReadyCompletedTracker] = ProcessedTracker,
              running: bool = False) -> Any:
    return Progress(_same(total, running, cls), _same(current, running, cls))


class EvaluationLoopProgress:
    """``trainer.fit_loop.epoch_loop.val_loop``, ``trainer.validate_loop``, ``test_loop``, ``predict_loop``.

    ``batch_progress`` counts evaluation batches: ``current`` those of the running (or last) evaluation across its
    dataloaders; ``total`` inside fit those of this training epoch (the sanity check's are not kept), otherwise
    those of every run of the stage. The fit loop validates through ``val_loop.run()``, so replacing it replaces
    the fit's validations; outside a fit (and for the other loops, which Trainer.validate/test/predict run
    themselves) ``run()`` does nothing.
    """

    def __init__(self, trainer: LoopTrainer, stage: str) -> None:
        self._trainer = trainer
        self._stage = stage
        self.batch_progress = BatchProgress()
        #: the running stage's evaluation (set while it runs)
        self._runner: Any = None
        # predict only, for prediction writers (trainer/prediction_indices.py fills them while a writer listens)
        self.current_batch_indices: list[int] = []
        self.epoch_batch_indices: list[list[list[int]]] = []
        self._predictions: list[list[Any]] = []

    @property
    def predictions(self) -> list[Any]:
        """predict: the predictions kept so far (one loader: its list; several: a list per loader)."""
        preds = self._predictions
        return preds[0] if len(preds) == 1 else preds

    def set_predictions(self, per_loader: list[list[Any]]) -> None:
        """The predict loop's per-loader lists (the object it appends to)."""
        self._predictions = per_loader

    def run(self) -> None:
        """Validate now (inside a fit; elsewhere nothing happens)."""
        if self._runner is not None:
            self._runner()

    @property
    def max_batches(self) -> list[int | float]:
        """Batches per dataloader this evaluation runs (the sanity check's inside it)."""
        t = self._trainer
        if self._stage == "validate" and t.sanity_checking:
            return list(t.num_sanity_val_batches)
        return list(getattr(t, f"num_{'val' if self._stage == 'validate' else self._stage}_batches"))

    @property
    def skip(self) -> bool:
        """Whether this evaluation has no batch to run."""
        return sum(self.max_batches) == 0


class _Optimization:
    """``epoch_loop.automatic_optimization`` (``optim_progress``) and ``epoch_loop.manual_optimization``
    (``optim_step_progress``): the optimizer steps of the run and of this epoch, either way."""

    def __init__(self, epoch_loop: EpochLoopProgress) -> None:
        self._epoch_loop = epoch_loop

    @property
    def optim_step_progress(self) -> Progress:
        total, current = self._epoch_loop._steps()
        return _progress(total, current, ReadyCompletedTracker)

    @property
    def optim_progress(self) -> OptimizationProgress:
        total, current = self._epoch_loop._steps()
        return OptimizationProgress(OptimizerProgress(step=self.optim_step_progress,
                                                      zero_grad=_progress(total, current, StartedTracker)))


class EpochLoopProgress:
    """``trainer.fit_loop.epoch_loop``: the batches of the running (or last) epoch, the steps, and ``val_loop``."""

    def __init__(self, trainer: LoopTrainer) -> None:
        self._trainer = trainer
        self.val_loop = EvaluationLoopProgress(trainer, "validate")
        self.automatic_optimization = _Optimization(self)
        self.manual_optimization = _Optimization(self)

    @property
    def batch_progress(self) -> BatchProgress:
        """Training batches: ``current`` in this epoch, ``total`` since the run began (a snapshot)."""
        position = self._trainer.state.fit_position
        in_epoch = position.batches_done if position is not None else 0
        total = ((position.batches_before or 0) if position is not None else 0) + in_epoch
        return BatchProgress(_same(total), _same(in_epoch), is_last_batch=bool(self._trainer.is_last_batch))

    def _steps(self) -> tuple[int, int]:
        """Optimizer steps in the whole run, and in this epoch."""
        t = self._trainer
        position = t.state.fit_position
        before = position.steps_before if position is not None else None
        return t.global_step, t.global_step - (before if before is not None else t.global_step)

    @property
    def global_step(self) -> int:
        return self._trainer.global_step

    @property
    def total_batch_idx(self) -> int:
        """Index of the last training batch reached, counted across epochs (-1 before the first)."""
        return self.batch_progress.total.ready - 1

    @property
    def batch_idx(self) -> int:
        """Index of the last training batch reached in this epoch (-1 before the first)."""
        position = self._trainer.state.fit_position
        return (position.batches_done if position is not None else 0) - 1

    @property
    def min_steps(self) -> int | None:
        return self._trainer.min_steps

    @property
    def max_steps(self) -> int:
        return self._trainer.max_steps

    @property
    def done(self) -> bool:
        """Whether the epoch loop ends here: max_steps reached, or a requested stop that min_epochs/min_steps allow."""
        t = self._trainer
        if t.max_steps != -1 and t.global_step >= t.max_steps:
            return True
        return bool(t.should_stop) and _can_stop(t, t.current_epoch)


def _can_stop(trainer: LoopTrainer, epochs_done: int) -> bool:
    return epochs_done >= (trainer.min_epochs or 0) and trainer.global_step >= (trainer.min_steps or 0)


def _trainer_attribute(name: str, doc: str) -> property:
    return property(lambda self: getattr(self._trainer, name),
                    lambda self, value: setattr(self._trainer, name, value), doc=doc)


class FitProgress:
    """``trainer.fit_loop``: epoch progress, the epoch loop's batch progress, and the fit's limits."""

    max_epochs = _trainer_attribute("max_epochs", "Epochs fit runs at most (-1: no limit); settable.")
    min_epochs = _trainer_attribute("min_epochs", "Epochs fit runs at least; settable.")
    max_steps = _trainer_attribute("max_steps", "Optimizer steps fit takes at most (-1: no limit); settable.")
    min_steps = _trainer_attribute("min_steps", "Optimizer steps fit takes at least; settable.")

    def __init__(self, trainer: LoopTrainer) -> None:
        self._trainer = trainer
        self.epoch_loop = EpochLoopProgress(trainer)
        self._held_stop_noted = False  # note_held_stop said it

    @property
    def epoch_progress(self) -> Progress:
        """Epochs: ``completed`` is the number of whole epochs done; during an epoch it is started, not done."""
        state = self._trainer.state
        position = state.fit_position
        running = state.fn == "fit" and position is not None and not position.epoch_done
        return _progress(state.current_epoch, state.current_epoch, running=running)

    @property
    def total_batch_idx(self) -> int:
        """Index of the last training batch reached, counted across epochs (-1 before the first)."""
        return self.epoch_loop.total_batch_idx

    @property
    def batch_idx(self) -> int:
        return self.epoch_loop.batch_idx

    @property
    def done(self) -> bool:
        t = self._trainer
        return (t.max_steps != -1 and t.global_step >= t.max_steps) or (
            t.max_epochs != -1 and t.current_epoch >= t.max_epochs
        )


def note_held_stop(trainer: LoopTrainer) -> None:
    """Rank 0 says, once per Trainer (as Lightning), that min_epochs/min_steps hold a requested stop back."""
    loop = trainer.fit_loop
    if loop._held_stop_noted or not trainer.is_global_zero:
        return
    loop._held_stop_noted = True
    logging.getLogger("torchfleet").info(
        "Trainer was signaled to stop but the required `min_epochs=%r` or `min_steps=%r` has not been met. Training "
        "will continue...", trainer.min_epochs, trainer.min_steps)


def trainer_loops(trainer: LoopTrainer) -> dict[str, Any]:
    """The Trainer's loop objects, made once: "fit", and "validate"/"test"/"predict" (the stand-alone stages)."""
    loops = trainer.__dict__.get("_loops")
    if loops is None:
        loops = trainer.__dict__["_loops"] = {"fit": FitProgress(trainer)}
        loops.update({s: EvaluationLoopProgress(trainer, s) for s in ("validate", "test", "predict")})
    return loops


def evaluation_loop(trainer: LoopTrainer, stage: str) -> EvaluationLoopProgress:
    """The loop object whose counters an evaluation of ``stage`` ("validate", "sanity_check", ...) advances."""
    loops = trainer_loops(trainer)
    if trainer.state.fn == "fit":
        return loops["fit"].epoch_loop.val_loop
    return loops[stage]
