"""Lightning's ``lightning.pytorch.callbacks.device_stats_monitor``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.trainer.callbacks.device_stats_monitor import DeviceStatsMonitor

__all__ = ["DeviceStatsMonitor"]
