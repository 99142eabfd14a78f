"""``lightning.pytorch.callbacks.finetuning`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.finetuning import BackboneFinetuning, BaseFinetuning, multiplicative

__all__ = ['BackboneFinetuning', 'BaseFinetuning', 'multiplicative']
