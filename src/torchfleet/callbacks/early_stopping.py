"""``lightning.pytorch.callbacks.early_stopping`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason

__all__ = ['EarlyStopping', 'EarlyStoppingReason']
