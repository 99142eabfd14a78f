"""The Trainer, its loops, logging, callbacks and loggers."""
