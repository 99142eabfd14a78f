"""SLURMEnvironment: processes started by srun inside an sbatch job."""

from __future__ import annotations

import os
import re

from torchfleet.environments._common import check_world_size, env_int
from torchfleet.environments.base import ClusterEnvironment
from torchfleet.errors import ConfigurationError


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand SLURM's compressed host list: "node[01-03,07],gpu5" -> node01, node02, node03, node07, gpu5."""
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            hosts.append(plain.strip())
            continue
        for part in ranges.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                width = len(lo)
                hosts.extend(f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1))
            else:
                hosts.append(f"{prefix}{part}")
    return [h for h in hosts if h]


class SLURMEnvironment(ClusterEnvironment):
    """Ranks from SLURM_PROCID/SLURM_LOCALID/SLURM_NODEID; rank 0 runs on the first host of the job."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        if "MASTER_ADDR" in os.environ:
            return os.environ["MASTER_ADDR"]
        nodelist = os.environ.get("SLURM_NODELIST", os.environ.get("SLURM_JOB_NODELIST", "127.0.0.1"))
        hosts = expand_nodelist(nodelist)
        return hosts[0] if hosts else "127.0.0.1"

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return int(os.environ["MASTER_PORT"])
        # every task derives the same port from the job id, without talking to the others
        job_id = os.environ.get("SLURM_JOB_ID", "0")
        return 10000 + int(job_id[-4:]) if job_id[-4:].isdigit() else 12910

    @staticmethod
    def detect() -> bool:
        if "SLURM_NTASKS" not in os.environ:
            return False
        # an interactive allocation (salloc + a shell) is not an srun-launched job
        return os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive")

    def world_size(self) -> int:
        return env_int("SLURM_NTASKS")

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        return env_int("SLURM_PROCID")

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return env_int("SLURM_LOCALID")

    def node_rank(self) -> int:
        return env_int("SLURM_NODEID")

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        per_node = os.environ.get("SLURM_NTASKS_PER_NODE")
        if per_node and per_node.split("(")[0].isdigit() and int(per_node.split("(")[0]) != num_devices:
            raise ConfigurationError(
                f"SLURM runs {per_node.split('(')[0]} tasks per node (--ntasks-per-node), but the Trainer has "
                f"devices={num_devices}. Set #SBATCH --ntasks-per-node={num_devices}, or devices to the tasks per node."
            )
        nnodes = os.environ.get("SLURM_NNODES")
        if nnodes and nnodes.isdigit() and int(nnodes) != num_nodes:
            raise ConfigurationError(
                f"The SLURM job has {nnodes} nodes (--nodes), but the Trainer has num_nodes={num_nodes}. Set "
                f"#SBATCH --nodes={num_nodes}, or num_nodes={nnodes}."
            )
        check_world_size(
            "SLURM", self.world_size(), num_devices, num_nodes,
            f"#SBATCH --nodes={num_nodes} --ntasks-per-node={num_devices} and launch with srun.",
        )
