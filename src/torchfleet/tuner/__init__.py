"""Lightning's Tuner: ``Tuner(trainer).lr_find(model, ...)``."""

from torchfleet.tuner.tuning import Tuner

__all__ = ["Tuner"]
