"""``lightning.fabric.fabric`` under torchfleet's name (docs/porting.md, "Lightning's module paths")."""

from torchfleet.fleet import Fleet

__all__ = ['Fleet']
