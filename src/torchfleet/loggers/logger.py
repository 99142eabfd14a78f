"""``lightning.pytorch.loggers.logger`` and ``lightning.fabric.loggers.logger`` under torchfleet's name (docs/porting.md,
"Lightning's module paths")."""

from torchfleet.loggers.base import DummyLogger, Logger, rank_zero_experiment

__all__ = ["DummyLogger", "Logger", "rank_zero_experiment"]
