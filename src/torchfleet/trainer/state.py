"""RunState: where a Trainer's run is (stage, epoch, step, loop position, metrics), in one object.

The Trainer owns one and passes it to the loops; ``state_dict``/``load_state_dict`` are the one place
its checkpointed part is saved and restored, ``snapshot``/``load_snapshot`` the one place rank 0's
state travels back to the launching process under ddp_spawn / ddp_fork.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    #: the fit loop's position, saved in checkpoints as loops["fit"]
    progress: dict[str, Any] | None = None
    #: what a restored checkpoint says about where fit continues: {"loops": progress, "rng": rng}
    resume: dict[str, Any] | None = None
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

    def start_stage(self, stage: str) -> None:
        """A stage begins: nothing stops it yet, and no loop position or resume point is left from before."""
        self.fn = TrainerFn(stage)
        self.status = TrainerStatus.RUNNING
        self.should_stop = False
        self.resume = None
        self.progress = None
        # as Lightning: each stage starts with no metrics (none left from an earlier fit, validate or test)
        self.train_results = None
        self.epoch_metrics, self.bar_metrics, self.logged_metrics = {}, {}, {}

    def end_stage(self, failed: bool) -> None:
        """The stage returned (finished) or raised (interrupted)."""
        self.fn = None
        self.in_train = False
        self.status = TrainerStatus.INTERRUPTED if failed else TrainerStatus.FINISHED

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint entries of the run's position: epoch, global_step and the fit loop's progress."""
        return {
            "epoch": self.current_epoch,
            "global_step": self.global_step,
            "loops": {"fit": dict(self.progress)} if self.progress is not None else {},
        }

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        """Continue from ``checkpoint``'s position: the fit loop reads ``resume`` when it starts."""
        self.current_epoch = checkpoint["epoch"]
        self.global_step = checkpoint["global_step"]
        self.resume = {"loops": checkpoint.get("loops", {}).get("fit"), "rng": checkpoint.get("rng")}

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
