"""Lightning's ``lightning.pytorch.core.saving``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.loggers.base import load_hparams_from_yaml, save_hparams_to_yaml

__all__ = ["load_hparams_from_yaml", "save_hparams_to_yaml"]
