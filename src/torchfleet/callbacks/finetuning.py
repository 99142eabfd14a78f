"""Lightning's ``lightning.pytorch.callbacks.finetuning``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.finetuning import BackboneFinetuning, BaseFinetuning, multiplicative

__all__ = ["BackboneFinetuning", "BaseFinetuning", "multiplicative"]
