"""RunState: where a Trainer's run is (stage, epoch, step, loop position, metrics), in one object.

The Trainer owns one and passes it to the loops; ``state_dict``/``load_state_dict`` are the one place
its checkpointed part is saved and restored, ``snapshot``/``load_snapshot`` the one place rank 0's
state travels back to the launching process under ddp_spawn / ddp_fork.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor, nn

    from torchfleet.trainer.logging import Results


class _ValueEnum(str, Enum):
    """Equal to, and printed as, its plain string value (as Lightning's enums)."""

    def __str__(self) -> str:
        return self.value


class TrainerFn(_ValueEnum):
    """Which Trainer entry point runs (Lightning's ``trainer.state.fn``); equal to its plain string."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(_ValueEnum):
    """What runs inside the entry point (Lightning's ``trainer.state.stage``); fit runs three of them."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)


class TrainerStatus(_ValueEnum):
    """Whether a Trainer has run (Lightning's ``trainer.state.status``)."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"

    @property
    def stopped(self) -> bool:
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


class _Status:
    """``finished`` and ``stopped``, read from a ``status`` field."""

    __slots__ = ()
    status: TrainerStatus

    @property
    def finished(self) -> bool:
        return self.status is TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        return self.status.stopped


@dataclass
class TrainerState(_Status):
    """Lightning's ``TrainerState``: a ``(status, fn, stage)`` triple, equal to any state with those three values.

    ``trainer.state`` holds more (the run's counters), so a ported ``trainer.state == TrainerState(...)``
    compares these three fields only.
    """

    status: TrainerStatus = TrainerStatus.INITIALIZING
    fn: TrainerFn | None = None
    stage: RunningStage | None = None

    def __eq__(self, other: object) -> bool:
        fields = ("status", "fn", "stage")
        if not all(hasattr(other, f) for f in fields):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in fields)


@dataclass(slots=True)
class FitPosition:
    """Where fit is among its epochs and batches: what a checkpoint saves as ``loops["fit"]`` (a plain dict whose keys
    are these fields' names) and a resumed fit continues from.

    Not Lightning's loop progress counters (``trainer.fit_loop``, trainer/progress.py), which are read from it.
    """

    #: the epoch this position is in
    epoch: int = 0
    #: the training batches of ``epoch`` already run
    batches_done: int = 0
    #: ``epoch`` ran to its end (its end-of-epoch hooks too)
    epoch_done: bool = False
    #: a validation is due after the last batch run (it was interrupted, or the save happened before it)
    val_pending: bool = False
    #: the RNG state at the start of ``epoch``: a resumed run recreates the same shuffle order from it
    epoch_start_rng: dict[str, Any] | None = None
    #: the run stopped before ``epoch``'s last batch: a resumed run continues inside it
    stopped_mid_epoch: bool = False
    #: the RNG state where the run stopped (None: the save happened inside the loop; the checkpoint's "rng" holds it)
    resume_rng: dict[str, Any] | None = None
    #: ``epoch``'s epoch-interval LR schedulers already stepped (after its last batch)
    epoch_stepped: bool = False
    #: training batches of the epochs before ``epoch`` (None: a checkpoint written before this was saved)
    batches_before: int | None = 0
    #: ``global_step`` when ``epoch`` started (None: not known yet, or not saved)
    steps_before: int | None = None

    def to_checkpoint(self) -> dict[str, Any]:
        """The plain dict saved as ``loops["fit"]`` (the fields that are None because unknown are left out)."""
        saved = {f.name: getattr(self, f.name) for f in fields(self)}
        for optional in ("batches_before", "steps_before"):
            if saved[optional] is None:
                del saved[optional]
        return saved

    @classmethod
    def from_checkpoint(cls, saved: dict[str, Any]) -> FitPosition:
        """The position a checkpoint's ``loops["fit"]`` holds; keys an older checkpoint lacks take their defaults
        (``batches_before`` and ``steps_before``: None, not known), keys this version does not know are ignored."""
        known = {f.name: saved[f.name] for f in fields(cls) if f.name in saved}
        known.setdefault("batches_before", None)
        return cls(**known)


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """What a restored checkpoint says about where fit continues: its fit position (None: it saved none) and the RNG
    state at the save (None: it saved none)."""

    position: FitPosition | None
    rng: dict[str, Any] | None


@dataclass(slots=True)
class RunState(_Status):
    """The state of a Trainer run that the loops read and write (the Trainer's public counters read it).

    ``fn``, ``stage`` and ``status`` are the three fields Lightning's ``trainer.state`` has, with the same
    enum values (``trainer.state.fn == "fit"``, ``trainer.state.stage == "train"``).
    """

    #: the running entry point: fit, validate, test, predict (None between them)
    fn: TrainerFn | None = None
    status: TrainerStatus = TrainerStatus.INITIALIZING
    current_epoch: int = 0
    global_step: int = 0
    should_stop: bool = False
    sanity_checking: bool = False
    #: inside the training part of fit (not its validation)
    in_train: bool = False
    #: the model as the strategy set it up (wrapped: DDP, FSDP, the DeepSpeed engine)
    wrapped: nn.Module | None = None
    #: where the running (or last) fit is among its epochs and batches, saved in checkpoints as loops["fit"]
    fit_position: FitPosition | None = None
    #: where fit continues, from a restored checkpoint (None: from the start)
    resume: ResumePoint | None = None
    #: the current training epoch's self.log values
    train_results: Results | None = None
    epoch_metrics: dict[str, Tensor] = field(default_factory=dict)
    bar_metrics: dict[str, Any] = field(default_factory=dict)
    logged_metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def stage(self) -> RunningStage | None:
        """What runs now: "train", "sanity_check", "validate" (inside fit too), "test" or "predict"."""
        fn = self.fn
        if fn is None:
            return None
        if fn is not TrainerFn.FITTING:
            return RunningStage(fn.value)
        if self.sanity_checking:
            return RunningStage.SANITY_CHECKING
        return RunningStage.TRAINING if self.in_train else RunningStage.VALIDATING

    @stage.setter
    def stage(self, stage: RunningStage | str | None) -> None:
        """Set by hand (ported Lightning tests and tools do): the entry point and flags that give ``stage``."""
        self.sanity_checking = self.in_train = False
        if stage is None:
            return
        stage = RunningStage(stage)
        if stage in (RunningStage.TRAINING, RunningStage.SANITY_CHECKING) or (
            stage is RunningStage.VALIDATING and self.fn is TrainerFn.FITTING
        ):
            self.fn = TrainerFn.FITTING  # training, the sanity check and fit's validation run inside fit
            self.sanity_checking = stage is RunningStage.SANITY_CHECKING
            self.in_train = stage is RunningStage.TRAINING
        else:
            self.fn = TrainerFn(stage.value)

    def start_stage(self, stage: str) -> None:
        """A stage begins: nothing stops it yet, and no loop position or resume point is left from before."""
        self.fn = TrainerFn(stage)
        self.status = TrainerStatus.RUNNING
        self.should_stop = False
        self.resume = None
        self.fit_position = None
        # as Lightning: each stage starts with no metrics (none left from an earlier fit, validate or test)
        self.train_results = None
        self.epoch_metrics, self.bar_metrics, self.logged_metrics = {}, {}, {}

    def end_stage(self, failed: bool) -> None:
        """The stage returned (finished) or raised (interrupted)."""
        self.fn = None
        self.in_train = False
        self.status = TrainerStatus.INTERRUPTED if failed else TrainerStatus.FINISHED

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint entries of the run's position: epoch, global_step and the fit loop's position."""
        return {
            "epoch": self.current_epoch,
            "global_step": self.global_step,
            "loops": {"fit": self.fit_position.to_checkpoint()} if self.fit_position is not None else {},
        }

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        """Continue from ``checkpoint``'s position: the fit loop reads ``resume`` when it starts."""
        self.current_epoch = checkpoint["epoch"]
        self.global_step = checkpoint["global_step"]
        saved = checkpoint.get("loops", {}).get("fit")
        self.resume = ResumePoint(FitPosition.from_checkpoint(saved) if saved else None, checkpoint.get("rng"))

    def snapshot(self, callback_metrics: dict[str, Any], progress_bar_metrics: dict[str, Any]) -> dict[str, Any]:
        """What the launching process's Trainer shows after a stage that ran in child processes (tensors as given)."""
        return {
            "global_step": self.global_step,
            "current_epoch": self.current_epoch,
            "should_stop": self.should_stop,
            "callback_metrics": callback_metrics,
            "logged_metrics": dict(self.logged_metrics),
            "progress_bar_metrics": progress_bar_metrics,
        }

    def load_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Take over what ``snapshot`` recorded in rank 0."""
        self.global_step = snapshot["global_step"]
        self.current_epoch = snapshot["current_epoch"]
        self.should_stop = snapshot["should_stop"]
        self.train_results = None
        self.epoch_metrics = snapshot["callback_metrics"]
        self.logged_metrics = snapshot["logged_metrics"]
        self.bar_metrics = snapshot["progress_bar_metrics"]
