"""TorchElastic, LSF, MPI and Kubeflow environments: properties and validate_settings."""

from __future__ import annotations

import pytest

from torchfleet.environments import (
    KubeflowEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    TorchElasticEnvironment,
)
from torchfleet.errors import ConfigurationError


@pytest.fixture
def torchrun(env):
    env(TORCHELASTIC_RUN_ID="abc", RANK=3, WORLD_SIZE=4, LOCAL_RANK=1, GROUP_RANK=1, LOCAL_WORLD_SIZE=2,
        MASTER_ADDR="node0", MASTER_PORT=1234)
    return env


def test_torchelastic_properties(torchrun):
    e = TorchElasticEnvironment()
    assert e.creates_processes_externally
    assert (e.world_size(), e.global_rank(), e.local_rank(), e.node_rank()) == (4, 3, 1, 1)
    assert (e.main_address, e.main_port) == ("node0", 1234)
    e.set_world_size(1)
    e.set_global_rank(0)
    assert (e.world_size(), e.global_rank()) == (4, 3)


def test_torchelastic_values_are_read_at_call_time(torchrun):
    e = TorchElasticEnvironment()
    torchrun(RANK=0, LOCAL_RANK=0, GROUP_RANK=0)
    assert (e.global_rank(), e.local_rank(), e.node_rank()) == (0, 0, 0)


def test_torchelastic_validate(torchrun):
    e = TorchElasticEnvironment()
    e.validate_settings(2, 2)
    with pytest.raises(ConfigurationError) as info:
        e.validate_settings(2, 1)
    text = str(info.value)
    assert "torchrun started 4 processes (WORLD_SIZE=4)" in text
    assert "devices=2 x num_nodes=1 = 2" in text
    assert "devices=2 and num_nodes=2" in text  # the Trainer side of the fix, from LOCAL_WORLD_SIZE
    assert "--nproc-per-node=2" in text and "--nnodes=1" in text  # the torchrun side


def test_torchelastic_validate_per_node(torchrun):
    with pytest.raises(ConfigurationError) as info:
        TorchElasticEnvironment().validate_settings(4, 1)  # 4 x 1 = 4 agrees, but 2 per node do not
    text = str(info.value)
    assert "2 processes per node (LOCAL_WORLD_SIZE=2)" in text and "devices=4" in text


def test_torchelastic_without_local_world_size(env):
    env(RANK=0, WORLD_SIZE=3, LOCAL_RANK=0, MASTER_ADDR="a", MASTER_PORT=1)
    e = TorchElasticEnvironment()
    assert e.node_rank() == 0
    e.validate_settings(3, 1)
    with pytest.raises(ConfigurationError, match="devices x num_nodes = 3"):
        e.validate_settings(2, 1)


def test_lsf_with_rankfile(env, tmp_path):
    rankfile = tmp_path / "ranks"
    rankfile.write_text("batch\nh1\nh1\nh2\nh2\n")
    env(LSB_JOBID=98765, JSM_NAMESPACE_SIZE=4, JSM_NAMESPACE_RANK=3, JSM_NAMESPACE_LOCAL_RANK=1,
        LSB_DJOB_RANKFILE=rankfile, HOSTNAME="h2")
    e = LSFEnvironment()
    assert LSFEnvironment.detect() and e.creates_processes_externally
    assert (e.world_size(), e.global_rank(), e.local_rank(), e.node_rank()) == (4, 3, 1, 1)
    assert e.main_address == "h1"  # the first compute host, not the batch node
    assert e.main_port == 10000 + 765  # Lightning's rule: the last three digits of the job id
    e.validate_settings(2, 2)
    with pytest.raises(ConfigurationError) as info:
        e.validate_settings(1, 1)
    text = str(info.value)
    assert "jsrun (LSF) started 4 processes (JSM_NAMESPACE_SIZE=4)" in text
    assert "devices=2 and num_nodes=2" in text


def test_lsf_with_mcpu_hosts(env):
    env(LSB_JOBID=5, JSM_NAMESPACE_SIZE=2, JSM_NAMESPACE_RANK=0, JSM_NAMESPACE_LOCAL_RANK=0,
        LSB_MCPU_HOSTS="launch 1 a.cluster 40 b.cluster 40", HOSTNAME="b")
    e = LSFEnvironment()
    assert e.main_address == "a.cluster"
    assert e.node_rank() == 0  # "b" is not "b.cluster": unknown hosts fall back to node 0
    env(HOSTNAME="b.cluster")
    assert e.node_rank() == 1
    assert e.main_port == 10005
    env(MASTER_ADDR="x", MASTER_PORT=7)
    assert (e.main_address, e.main_port) == ("x", 7)


def test_lsf_needs_all_variables(env):
    env(LSB_JOBID=1, JSM_NAMESPACE_SIZE=2, JSM_NAMESPACE_RANK=0)
    assert not LSFEnvironment.detect()


@pytest.mark.parametrize(
    "variables",
    [
        dict(OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_RANK=3, OMPI_COMM_WORLD_LOCAL_RANK=1,
             OMPI_COMM_WORLD_LOCAL_SIZE=2),
        dict(PMI_SIZE=4, PMI_RANK=3, MPI_LOCALRANKID=1, MPI_LOCALNRANKS=2),
        dict(MV2_COMM_WORLD_SIZE=4, MV2_COMM_WORLD_RANK=3, MV2_COMM_WORLD_LOCAL_RANK=1,
             MV2_COMM_WORLD_LOCAL_SIZE=2),
    ],
    ids=["openmpi", "pmi", "mvapich"],
)
def test_mpi_flavours(env, variables):
    env(**variables)
    e = MPIEnvironment()
    assert MPIEnvironment.detect() and e.creates_processes_externally
    assert (e.world_size(), e.global_rank(), e.local_rank(), e.node_rank()) == (4, 3, 1, 1)
    e.validate_settings(2, 2)
    with pytest.raises(ConfigurationError, match=r"mpirun started 4 processes \(\w+_SIZE=4\)"):
        e.validate_settings(2, 1)
    with pytest.raises(ConfigurationError, match="2 processes per node"):
        e.validate_settings(4, 1)


def test_mpi_address_and_port(env):
    env(PMI_SIZE=1, PMI_RANK=0)
    e = MPIEnvironment()
    assert (e.main_address, e.main_port) == ("127.0.0.1", 12910)  # the documented defaults
    assert (e.local_rank(), e.node_rank()) == (0, 0)  # no local variables: one node assumed
    env(MASTER_ADDR="n0", MASTER_PORT=5555)
    assert (e.main_address, e.main_port) == ("n0", 5555)


@pytest.fixture
def kubeflow(env):
    env(KUBERNETES_PORT="tcp://10.0.0.1:443", MASTER_ADDR="job-master-0", MASTER_PORT=23456, WORLD_SIZE=3, RANK=2)
    return env


def test_kubeflow_properties(kubeflow):
    e = KubeflowEnvironment()
    assert KubeflowEnvironment.detect() and e.creates_processes_externally
    assert (e.world_size(), e.global_rank(), e.local_rank(), e.node_rank()) == (3, 2, 0, 2)
    assert (e.main_address, e.main_port) == ("job-master-0", 23456)


def test_kubeflow_validate(kubeflow):
    e = KubeflowEnvironment()
    e.validate_settings(1, 3)
    with pytest.raises(ConfigurationError) as info:
        e.validate_settings(2, 3)
    text = str(info.value)
    assert "started 3 processes (WORLD_SIZE=3)" in text and "devices=2 x num_nodes=3 = 6" in text
    assert "devices=1 and num_nodes=3" in text


def test_kubeflow_needs_kubernetes(env):
    env(MASTER_ADDR="a", MASTER_PORT=1, WORLD_SIZE=2, RANK=0)
    assert not KubeflowEnvironment.detect()


def test_missing_variable_is_a_clear_error(env):
    env(TORCHELASTIC_RUN_ID="x")  # detected by the run id, but the rank variables are missing
    with pytest.raises(ConfigurationError, match="WORLD_SIZE is set"):
        TorchElasticEnvironment().world_size()
