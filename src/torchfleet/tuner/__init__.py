"""Lightning's Tuner: ``Tuner(trainer).lr_find(model, ...)`` and ``Tuner(trainer).scale_batch_size(model, ...)``."""

from torchfleet.tuner.tuning import Tuner

__all__ = ["Tuner"]
