"""``lightning.pytorch.callbacks.progress`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.progress import ProgressBar, TQDMProgressBar
from torchfleet.trainer.callbacks.rich_progress import RichProgressBar

__all__ = ['ProgressBar', 'TQDMProgressBar', 'RichProgressBar']
