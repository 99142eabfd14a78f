"""Lightning's ``trainer.states`` names: the enums of ``trainer.state`` (``fn``, ``stage``, ``status``)."""

from torchfleet.trainer.state import RunningStage, TrainerFn, TrainerState, TrainerStatus

__all__ = ["RunningStage", "TrainerFn", "TrainerState", "TrainerStatus"]
