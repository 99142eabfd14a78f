"""Callbacks shipped with torchfleet."""

from torchfleet.trainer.callbacks.base import Callback, Checkpoint
from torchfleet.trainer.callbacks.batch_size_finder import BatchSizeFinder
from torchfleet.trainer.callbacks.checkpoint import ModelCheckpoint
from torchfleet.trainer.callbacks.device_stats_monitor import DeviceStatsMonitor
from torchfleet.trainer.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from torchfleet.trainer.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from torchfleet.trainer.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
from torchfleet.trainer.callbacks.lambda_function import LambdaCallback
from torchfleet.trainer.callbacks.lr_finder import LearningRateFinder
from torchfleet.trainer.callbacks.lr_monitor import LearningRateMonitor
from torchfleet.trainer.callbacks.model_summary import ModelSummary, RichModelSummary
from torchfleet.trainer.callbacks.on_exception_checkpoint import OnExceptionCheckpoint
from torchfleet.trainer.callbacks.prediction_writer import BasePredictionWriter, WriteInterval
from torchfleet.trainer.callbacks.progress import ProgressBar, TQDMProgressBar
from torchfleet.trainer.callbacks.rich_progress import RichProgressBar
from torchfleet.trainer.callbacks.stochastic_weight_avg import StochasticWeightAveraging
from torchfleet.trainer.callbacks.throughput import ThroughputMonitor
from torchfleet.trainer.callbacks.timer import Timer

__all__ = ["Callback", "Checkpoint", "ModelCheckpoint", "EarlyStopping", "EarlyStoppingReason", "ProgressBar", "TQDMProgressBar",
           "RichProgressBar", "ModelSummary", "RichModelSummary", "LearningRateMonitor", "ThroughputMonitor", "Timer",
           "LambdaCallback", "BaseFinetuning", "BackboneFinetuning", "OnExceptionCheckpoint", "BasePredictionWriter",
           "WriteInterval", "GradientAccumulationScheduler",
           "LearningRateFinder", "BatchSizeFinder", "StochasticWeightAveraging",
           "DeviceStatsMonitor"]
