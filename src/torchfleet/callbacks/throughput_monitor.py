"""``lightning.pytorch.callbacks.throughput_monitor`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.trainer.callbacks.throughput import ThroughputMonitor

__all__ = ['ThroughputMonitor']
