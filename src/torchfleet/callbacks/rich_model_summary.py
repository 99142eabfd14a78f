"""``lightning.pytorch.callbacks.rich_model_summary`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.model_summary import RichModelSummary

__all__ = ['RichModelSummary']
