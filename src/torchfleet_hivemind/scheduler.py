"""LR schedulers that step once per collaborative epoch (hivemind.Optimizer's ``local_epoch``), not per batch."""

from __future__ import annotations

from typing import Any


class CollaborativeEpochScheduler:
    """Wraps a torch LR scheduler so that the Trainer's ``step()`` calls advance it to the collaboration's epoch.

    The Trainer steps a scheduler every batch or epoch of *this* peer; under Hivemind the optimizer really steps
    once per collaborative epoch (``target_batch_size`` samples over all peers), so each ``step()`` here steps
    the wrapped scheduler until its ``last_epoch`` equals the optimizer's ``local_epoch`` (none, one, or several
    when the peer caught up with the others). Everything else (``get_last_lr``, ``state_dict``...) is the
    wrapped scheduler's, so a checkpoint holds the plain scheduler's state.
    """

    def __init__(self, optimizer: Any, scheduler: Any) -> None:
        self.__dict__.update(hivemind_optimizer=optimizer, scheduler=scheduler)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["scheduler"], name)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the wrapped scheduler up to the collaboration's epoch (its arguments are ignored)."""
        for _ in range(self.hivemind_optimizer.local_epoch - self.scheduler.last_epoch):
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)
