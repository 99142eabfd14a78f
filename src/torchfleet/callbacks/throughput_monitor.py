"""Lightning's ``lightning.pytorch.callbacks.throughput_monitor``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.throughput import ThroughputMonitor

__all__ = ["ThroughputMonitor"]
