"""torchfleet-hivemind: the ``hivemind`` strategy, a plugin found through the ``torchfleet.strategies`` entry points.

It ships in torchfleet's distribution but registers exactly as a third-party package does (pyproject.toml's
``[project.entry-points."torchfleet.strategies"]``), and it imports hivemind only when a strategy is built, so
this package, and torchfleet, import without it. ``pip install torchfleet[hivemind]`` installs hivemind.
"""

from __future__ import annotations

from typing import Any

from torchfleet_hivemind.scheduler import CollaborativeEpochScheduler
from torchfleet_hivemind.strategy import INSTALL_HINT, HivemindStrategy

__all__ = ["HivemindStrategy", "CollaborativeEpochScheduler", "INSTALL_HINT", "register"]

#: what ``strategy="hivemind"`` builds: the seed docs' example, 8192 samples per collaborative epoch
DEFAULT_TARGET_BATCH_SIZE = 8192


def register(registry: Any) -> None:
    """The entry point: register ``"hivemind"`` in torchfleet's StrategyRegistry (it receives the registry)."""
    registry.register(
        "hivemind", HivemindStrategy, target_batch_size=DEFAULT_TARGET_BATCH_SIZE,
        description=("Hivemind: peers on unreliable machines and slow links train together, averaging once every "
                     f"{DEFAULT_TARGET_BATCH_SIZE} samples (target_batch_size) the collaboration has seen."),
    )
