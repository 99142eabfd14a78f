"""``lightning.pytorch.callbacks.progress.progress_bar`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.progress import ProgressBar, get_standard_metrics

__all__ = ["ProgressBar", "get_standard_metrics"]
