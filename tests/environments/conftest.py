"""A clean environment for each test: every variable a ClusterEnvironment reads is removed first."""

from __future__ import annotations

from collections.abc import Callable

import pytest

ENV_VARS = [
    "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "MASTER_ADDR", "MASTER_PORT",
    "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NODELIST", "SLURM_JOB_NODELIST",
    "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES",
    "LSB_JOBID", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK", "LSB_DJOB_RANKFILE",
    "LSB_MCPU_HOSTS", "HOSTNAME",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE",
    "KUBERNETES_PORT",
]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Remove every cluster variable; call with NAME=value to set some."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)

    def set_vars(**values: object) -> None:
        for key, value in values.items():
            monkeypatch.setenv(key, str(value))

    return set_vars
