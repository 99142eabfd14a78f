"""``lightning.pytorch.core.saving`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.loggers.base import load_hparams_from_yaml, save_hparams_to_yaml

__all__ = ['load_hparams_from_yaml', 'save_hparams_to_yaml']
