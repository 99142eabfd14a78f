"""Lightning's ``lightning.pytorch.callbacks.progress.tqdm_progress``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.progress import TQDMProgressBar, convert_inf

__all__ = ["TQDMProgressBar", "convert_inf"]
