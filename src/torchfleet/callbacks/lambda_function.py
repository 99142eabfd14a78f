"""Lightning's ``lightning.pytorch.callbacks.lambda_function``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.lambda_function import LambdaCallback

__all__ = ["LambdaCallback"]
