"""``lightning.pytorch.loggers.csv_logs`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.loggers.csv import CSVLogger, CSVWriter

__all__ = ['CSVLogger', 'CSVWriter']
