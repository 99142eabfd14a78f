"""Lightning's ``lightning.pytorch.callbacks.rich_model_summary``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.model_summary import RichModelSummary

__all__ = ["RichModelSummary"]
