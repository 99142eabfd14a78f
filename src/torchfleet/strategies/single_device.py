"""SingleDeviceStrategy: train in this one process on one device."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchfleet.errors import ConfigurationError
from torchfleet.strategies.arguments import PARTS, takes
from torchfleet.strategies.strategy import Strategy

if TYPE_CHECKING:
    from torchfleet.environments.base import ClusterEnvironment


class SingleDeviceStrategy(Strategy):
    """Train in this one process on one device (CPU, one CUDA GPU or MPS)."""

    @takes("device", *PARTS)
    def __init__(self, given: dict[str, Any], device: str | torch.device | int | None = None) -> None:
        super().__init__(**given)
        self._device = _as_device(device) if device is not None else None

    def configure(self, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment) -> None:
        if len(devices) * num_nodes != 1:
            raise ConfigurationError(
                f"strategy='single_device' trains in one process on one device, but devices={len(devices)} and "
                f"num_nodes={num_nodes} ask for {len(devices) * num_nodes}. Use devices=1 and num_nodes=1, "
                "or a multi-process strategy such as 'ddp'."
            )
        if self._device is None:
            self._device = devices[0]

    @property
    def root_device(self) -> torch.device:
        return self._device if self._device is not None else torch.device("cpu")

    @property
    def requested_device_type(self) -> str | None:
        return self._device.type if self._device is not None else None

    @property
    def device_ids(self) -> list[int]:
        return [self.root_device.index or 0]


def _as_device(device: str | torch.device | int) -> torch.device:
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)
