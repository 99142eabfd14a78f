"""Lightning's ``lightning.pytorch.callbacks.progress.progress_bar``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.progress import ProgressBar, get_standard_metrics

__all__ = ["ProgressBar", "get_standard_metrics"]
