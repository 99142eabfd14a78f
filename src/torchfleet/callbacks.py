"""Public callbacks: ``from torchfleet.callbacks import ModelCheckpoint, EarlyStopping, ...``."""

from torchfleet.trainer.callbacks import (
    Callback,
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
    ThroughputMonitor,
    Timer,
)

__all__ = ["Callback", "ModelCheckpoint", "EarlyStopping", "ProgressBar", "LearningRateMonitor", "ThroughputMonitor", "Timer"]
