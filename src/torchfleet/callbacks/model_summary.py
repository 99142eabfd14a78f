"""Lightning's ``lightning.pytorch.callbacks.model_summary``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.model_summary import ModelSummary

__all__ = ["ModelSummary"]
