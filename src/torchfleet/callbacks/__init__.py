"""Public callbacks: ``from torchfleet.callbacks import ModelCheckpoint, EarlyStopping, ...``.

The submodules have Lightning's module names (``torchfleet.callbacks.early_stopping``, ``.model_checkpoint``,
``.progress.tqdm_progress``, ...) and import the same classes, which live in ``torchfleet.trainer.callbacks``."""

from torchfleet.trainer.callbacks import (
    BackboneFinetuning,
    BaseFinetuning,
    BasePredictionWriter,
    BatchSizeFinder,
    Callback,
    Checkpoint,
    DeviceStatsMonitor,
    EarlyStopping,
    EarlyStoppingReason,
    GradientAccumulationScheduler,
    LambdaCallback,
    LearningRateFinder,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    OnExceptionCheckpoint,
    ProgressBar,
    RichModelSummary,
    RichProgressBar,
    StochasticWeightAveraging,
    ThroughputMonitor,
    Timer,
    TQDMProgressBar,
    WriteInterval,
)

__all__ = ["Callback", "Checkpoint", "ModelCheckpoint", "EarlyStopping", "EarlyStoppingReason", "ProgressBar",
           "TQDMProgressBar", "RichProgressBar", "ModelSummary", "RichModelSummary", "LearningRateMonitor",
           "ThroughputMonitor", "Timer", "LambdaCallback", "BaseFinetuning", "BackboneFinetuning",
           "OnExceptionCheckpoint", "BasePredictionWriter", "WriteInterval", "GradientAccumulationScheduler",
           "LearningRateFinder", "BatchSizeFinder", "StochasticWeightAveraging", "DeviceStatsMonitor"]
