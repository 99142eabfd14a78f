"""``lightning.pytorch.callbacks.progress.tqdm_progress`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.progress import TQDMProgressBar, convert_inf

__all__ = ["TQDMProgressBar", "convert_inf"]
