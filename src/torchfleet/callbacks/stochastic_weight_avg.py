"""Lightning's ``lightning.pytorch.callbacks.stochastic_weight_avg``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.stochastic_weight_avg import StochasticWeightAveraging

__all__ = ["StochasticWeightAveraging"]
