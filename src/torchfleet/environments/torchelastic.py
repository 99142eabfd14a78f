"""TorchElasticEnvironment: processes started by torchrun (torch.distributed.run)."""

from __future__ import annotations

import os

from torchfleet.environments._common import (
    DEFAULT_PORT,
    LaunchedEnvironment,
    check_per_node,
    check_world_size,
    env_int,
)

_REQUIRED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class TorchElasticEnvironment(LaunchedEnvironment):
    """torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT.

    Detected by TORCHELASTIC_RUN_ID, or by all of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
    MASTER_PORT (other launchers that imitate torchrun). torchrun decides the ranks, so the
    setters do nothing.
    """

    WORLD_SIZE, RANK, LOCAL_RANK = ("WORLD_SIZE",), ("RANK",), ("LOCAL_RANK",)

    @property
    def main_address(self) -> str:
        """MASTER_ADDR (127.0.0.1 when torchrun left it out, as a single-node run may)."""
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        """MASTER_PORT (12910, Lightning's default, when left out; torchrun itself always sets it)."""
        return env_int("MASTER_PORT", default=DEFAULT_PORT)

    @staticmethod
    def detect() -> bool:
        """Whether torchrun (or something setting its variables) started this process."""
        return "TORCHELASTIC_RUN_ID" in os.environ or all(k in os.environ for k in _REQUIRED)

    def node_rank(self) -> int:
        """GROUP_RANK (torchrun's node rank), else NODE_RANK, else 0."""
        return env_int("GROUP_RANK", "NODE_RANK", default=0)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise when WORLD_SIZE (or LOCAL_WORLD_SIZE) disagrees with devices x num_nodes (or devices)."""
        per_node = env_int("LOCAL_WORLD_SIZE", default=0) or None
        fix = f"run torchrun --nnodes={num_nodes} --nproc-per-node={num_devices}."
        check_world_size("torchrun", self.world_size(), num_devices, num_nodes, fix, "WORLD_SIZE", per_node)
        if per_node is not None:
            check_per_node("torchrun", per_node, "LOCAL_WORLD_SIZE", num_devices, fix)
