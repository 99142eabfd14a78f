"""Lightning's ``lightning.pytorch.loggers.csv_logs``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.loggers.csv import CSVLogger, CSVWriter

__all__ = ["CSVLogger", "CSVWriter"]
