"""``lightning.pytorch.core.optimizer`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.optim_wrapper import OptimizerWrapper

__all__ = ["OptimizerWrapper", "do_nothing_closure"]


def do_nothing_closure() -> None:
    """A closure for ``optimizer.step(closure)`` that computes nothing (the loss was computed already)."""
    return None
