"""``lightning.pytorch.callbacks.lambda_function`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.lambda_function import LambdaCallback

__all__ = ['LambdaCallback']
