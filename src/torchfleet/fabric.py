"""Lightning's ``lightning.fabric.fabric``, its names under torchfleet's (docs/porting.md)."""

from torchfleet.fleet import Fleet

__all__ = ["Fleet"]
