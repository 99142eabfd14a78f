"""Lightning's ``lightning.pytorch.callbacks.progress.rich_progress``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.rich_progress import RichProgressBar, RichProgressBarTheme

__all__ = ["RichProgressBar", "RichProgressBarTheme"]
