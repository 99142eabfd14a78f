"""Lightning's ``lightning.pytorch.callbacks.prediction_writer``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.prediction_writer import BasePredictionWriter, WriteInterval

__all__ = ["BasePredictionWriter", "WriteInterval"]
