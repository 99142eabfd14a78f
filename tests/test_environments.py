"""Cluster environments detect themselves from environment variables, in the documented order."""

from __future__ import annotations

import socket

import pytest

from torchfleet.environments import (
    KubeflowEnvironment,
    LocalEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    detect_environment,
    expand_nodelist,
)
from torchfleet.errors import ConfigurationError

_ALL = ["TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
        "MASTER_PORT", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NODELIST",
        "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES", "LSB_JOBID",
        "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK", "LSB_DJOB_RANKFILE", "LSB_MCPU_HOSTS",
        "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
        "PMI_SIZE", "PMI_RANK", "KUBERNETES_PORT", "HOSTNAME"]


@pytest.fixture
def env(monkeypatch):
    for name in _ALL:
        monkeypatch.delenv(name, raising=False)

    def set_vars(**values):
        for k, v in values.items():
            monkeypatch.setenv(k, str(v))

    return set_vars


def test_local_by_default(env):
    e = detect_environment()
    assert isinstance(e, LocalEnvironment)
    assert not e.creates_processes_externally
    assert e.main_address == "127.0.0.1"
    port = e.main_port
    assert e.main_port == port  # chosen once
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # and really free
    e.set_world_size(4)
    e.set_global_rank(2)
    assert (e.world_size(), e.global_rank(), e.local_rank(), e.node_rank()) == (4, 2, 0, 0)


def test_local_child_of_our_launcher(env):
    env(LOCAL_RANK=1, NODE_RANK=1, MASTER_ADDR="10.0.0.5", MASTER_PORT=29500, WORLD_SIZE=4)
    e = LocalEnvironment()
    assert e.creates_processes_externally
    assert (e.local_rank(), e.node_rank(), e.main_address, e.main_port, e.world_size()) == (1, 1, "10.0.0.5", 29500, 4)


def test_torchelastic(env):
    env(TORCHELASTIC_RUN_ID="abc", RANK=3, WORLD_SIZE=4, LOCAL_RANK=1, GROUP_RANK=1, MASTER_ADDR="node0", MASTER_PORT=1234)
    e = detect_environment()
    assert isinstance(e, TorchElasticEnvironment) and e.creates_processes_externally
    assert (e.world_size(), e.global_rank(), e.local_rank(), e.node_rank()) == (4, 3, 1, 1)
    assert (e.main_address, e.main_port) == ("node0", 1234)
    e.validate_settings(2, 2)
    with pytest.raises(ConfigurationError, match=r"torchrun started 4 processes.*devices=2 x num_nodes=1 = 2"):
        e.validate_settings(2, 1)


def test_slurm(env):
    env(SLURM_NTASKS=4, SLURM_PROCID=2, SLURM_LOCALID=0, SLURM_NODEID=1, SLURM_NODELIST="gpu[07-08]",
        SLURM_JOB_ID=123456, SLURM_NTASKS_PER_NODE=2, SLURM_NNODES=2, SLURM_JOB_NAME="train")
    e = detect_environment()
    assert isinstance(e, SLURMEnvironment)
    assert (e.world_size(), e.global_rank(), e.local_rank(), e.node_rank()) == (4, 2, 0, 1)
    assert e.main_address == "gpu07" and e.main_port == 13456
    e.validate_settings(2, 2)
    with pytest.raises(ConfigurationError, match="ntasks-per-node"):
        e.validate_settings(4, 1)
    with pytest.raises(ConfigurationError, match="--nodes"):
        e.validate_settings(2, 3)


def test_slurm_interactive_shell_is_not_detected(env):
    env(SLURM_NTASKS=1, SLURM_JOB_NAME="bash")
    assert isinstance(detect_environment(), LocalEnvironment)


def test_nodelist_expansion():
    assert expand_nodelist("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07", "gpu5"]
    assert expand_nodelist("host1") == ["host1"]
    assert expand_nodelist("a[9-11]") == ["a9", "a10", "a11"]


def test_lsf(env, tmp_path):
    rankfile = tmp_path / "ranks"
    rankfile.write_text("batch\nh1\nh1\nh2\nh2\n")
    env(LSB_JOBID=98765, JSM_NAMESPACE_SIZE=4, JSM_NAMESPACE_RANK=3, JSM_NAMESPACE_LOCAL_RANK=1,
        LSB_DJOB_RANKFILE=rankfile, HOSTNAME="h2")
    e = detect_environment()
    assert isinstance(e, LSFEnvironment)
    assert (e.world_size(), e.global_rank(), e.local_rank(), e.node_rank()) == (4, 3, 1, 1)
    assert e.main_address == "h1" and e.main_port == 18765
    with pytest.raises(ConfigurationError, match="started 4 processes"):
        e.validate_settings(1, 1)


def test_mpi(env):
    env(OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_RANK=3, OMPI_COMM_WORLD_LOCAL_RANK=1, OMPI_COMM_WORLD_LOCAL_SIZE=2)
    e = detect_environment()
    assert isinstance(e, MPIEnvironment)
    assert (e.world_size(), e.global_rank(), e.local_rank(), e.node_rank()) == (4, 3, 1, 1)
    assert (e.main_address, e.main_port) == ("127.0.0.1", 12910)
    env(MASTER_ADDR="n0", MASTER_PORT=5555)
    assert (e.main_address, e.main_port) == ("n0", 5555)
    with pytest.raises(ConfigurationError, match="mpirun"):
        e.validate_settings(2, 1)


def test_kubeflow(env):
    env(KUBERNETES_PORT="tcp://10.0.0.1:443", MASTER_ADDR="job-master-0", MASTER_PORT=23456, WORLD_SIZE=3, RANK=2)
    e = detect_environment()
    assert isinstance(e, KubeflowEnvironment)
    assert (e.world_size(), e.global_rank(), e.local_rank(), e.node_rank()) == (3, 2, 0, 2)
    e.validate_settings(1, 3)
    with pytest.raises(ConfigurationError, match="devices=1 and num_nodes=3"):
        e.validate_settings(2, 3)


def test_detection_order(env):
    # torchelastic beats slurm, slurm beats lsf, lsf beats mpi, mpi beats kubeflow
    env(KUBERNETES_PORT="x", MASTER_ADDR="a", MASTER_PORT=1, WORLD_SIZE=2, RANK=0)
    assert isinstance(detect_environment(), KubeflowEnvironment)
    env(OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_RANK=0)
    assert isinstance(detect_environment(), MPIEnvironment)
    env(LSB_JOBID=1, JSM_NAMESPACE_SIZE=2, JSM_NAMESPACE_RANK=0, JSM_NAMESPACE_LOCAL_RANK=0)
    assert isinstance(detect_environment(), LSFEnvironment)
    env(SLURM_NTASKS=2, SLURM_PROCID=0, SLURM_LOCALID=0, SLURM_NODEID=0)
    assert isinstance(detect_environment(), SLURMEnvironment)
    env(TORCHELASTIC_RUN_ID="x", LOCAL_RANK=0)
    assert isinstance(detect_environment(), TorchElasticEnvironment)
