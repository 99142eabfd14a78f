"""Lightning's ``lightning.pytorch.core.optimizer``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.optim_wrapper import OptimizerWrapper

__all__ = ["OptimizerWrapper", "do_nothing_closure"]


def do_nothing_closure() -> None:
    """A closure for ``optimizer.step(closure)`` that computes nothing (the loss was computed already)."""
    return None
