"""``lightning.pytorch.callbacks.progress.progress_bar`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.progress import ProgressBar

__all__ = ['ProgressBar']
