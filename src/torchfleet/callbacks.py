"""Public callbacks: ``from torchfleet.callbacks import ModelCheckpoint, EarlyStopping, ...``."""

from torchfleet.trainer.callbacks import (
    Callback,
    EarlyStopping,
    EarlyStoppingReason,
    LambdaCallback,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    RichModelSummary,
    RichProgressBar,
    ThroughputMonitor,
    Timer,
    TQDMProgressBar,
)

__all__ = ["Callback", "ModelCheckpoint", "EarlyStopping", "EarlyStoppingReason", "ProgressBar", "TQDMProgressBar",
           "RichProgressBar", "ModelSummary", "RichModelSummary", "LearningRateMonitor", "ThroughputMonitor", "Timer",
           "LambdaCallback"]
