"""``lightning.pytorch.loggers.logger`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.loggers.base import DummyLogger, Logger

__all__ = ['DummyLogger', 'Logger']
