"""``lightning.pytorch.callbacks.model_summary`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.model_summary import ModelSummary

__all__ = ['ModelSummary']
