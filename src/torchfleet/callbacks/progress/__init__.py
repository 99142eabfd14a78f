"""Lightning's ``lightning.pytorch.callbacks.progress``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.progress import ProgressBar, TQDMProgressBar
from torchfleet.trainer.callbacks.rich_progress import RichProgressBar

__all__ = ["ProgressBar", "TQDMProgressBar", "RichProgressBar"]
