"""Lightning's ``lightning.pytorch.callbacks.early_stopping``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason

__all__ = ["EarlyStopping", "EarlyStoppingReason"]
