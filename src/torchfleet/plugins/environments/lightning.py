"""``lightning.fabric.plugins.environments.lightning`` under torchfleet's name (docs/porting.md, "Lightning's module
paths"): Lightning's environment of processes the library starts itself is torchfleet's LocalEnvironment."""

from torchfleet.environments.local import find_free_port as find_free_network_port
from torchfleet.plugins.environments import LightningEnvironment, LocalEnvironment

__all__ = ["LightningEnvironment", "LocalEnvironment", "find_free_network_port"]
