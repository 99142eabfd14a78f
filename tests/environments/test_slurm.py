"""SLURMEnvironment and the compressed node-list parser."""

from __future__ import annotations

import pytest

from torchfleet.environments import SLURMEnvironment, expand_nodelist
from torchfleet.errors import ConfigurationError, LauncherSettingsError


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
        ("host1", ["host1"]),
        ("a,b,c", ["a", "b", "c"]),
        ("a[9-11]", ["a9", "a10", "a11"]),
        ("n[008-010]", ["n008", "n009", "n010"]),
        ("gpu-node[1,3]", ["gpu-node1", "gpu-node3"]),
        ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("x[5]", ["x5"]),
        ("c[1-2],d[3, 5]", ["c1", "c2", "d3", "d5"]),
        ("", []),
        ("node1.cluster.org,node2.cluster.org", ["node1.cluster.org", "node2.cluster.org"]),
        # whitespace separates hosts as commas do
        ("alpha beta gamma", ["alpha", "beta", "gamma"]),
        ("  alpha\tbeta\n", ["alpha", "beta"]),
        ("a, b ,c", ["a", "b", "c"]),
        ("node[01-02] gpu5", ["node01", "node02", "gpu5"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["node[1-3", "node1-3]", "node[a-c]", "node[1-]"])
def test_expand_nodelist_refuses_malformed(bad):
    with pytest.raises(ConfigurationError, match="SLURM node list"):
        expand_nodelist(bad)


@pytest.fixture
def slurm(env):
    env(SLURM_NTASKS=4, SLURM_PROCID=2, SLURM_LOCALID=0, SLURM_NODEID=1, SLURM_NODELIST="gpu[07-08]",
        SLURM_JOB_ID=123456, SLURM_NTASKS_PER_NODE=2, SLURM_NNODES=2, SLURM_JOB_NAME="train")
    return env


def test_properties(slurm):
    e = SLURMEnvironment()
    assert SLURMEnvironment.detect() and e.creates_processes_externally
    assert (e.world_size(), e.global_rank(), e.local_rank(), e.node_rank()) == (4, 2, 0, 1)
    assert e.main_address == "gpu07"
    assert e.main_port == 15000 + 3456  # Lightning's rule: 15000 + the last four digits of the job id


def test_setters_do_not_override_slurm(slurm):
    e = SLURMEnvironment()
    e.set_world_size(99)
    e.set_global_rank(98)
    assert (e.world_size(), e.global_rank()) == (4, 2)


def test_master_variables_win(slurm):
    slurm(MASTER_ADDR="10.1.1.1", MASTER_PORT=29555)
    e = SLURMEnvironment()
    assert (e.main_address, e.main_port) == ("10.1.1.1", 29555)


def test_job_nodelist_fallback_and_short_job_id(env):
    env(SLURM_NTASKS=1, SLURM_JOB_NODELIST="cn[3-4]", SLURM_JOB_ID=42)
    e = SLURMEnvironment()
    assert e.main_address == "cn3"
    assert e.main_port == 15042


def test_port_is_the_same_in_every_task(slurm):
    ports = set()
    for rank in range(4):
        slurm(SLURM_PROCID=rank, SLURM_LOCALID=rank % 2, SLURM_NODEID=rank // 2)
        ports.add(SLURMEnvironment().main_port)
    assert len(ports) == 1


def test_validate_matching(slurm):
    SLURMEnvironment().validate_settings(2, 2)


def test_validate_tasks_per_node(slurm):
    with pytest.raises(ConfigurationError) as info:
        SLURMEnvironment().validate_settings(4, 2)
    text = str(info.value)
    assert "2 tasks per node" in text and "devices=4" in text
    assert "--ntasks-per-node=4" in text and "srun" in text


def test_validate_nodes(slurm):
    with pytest.raises(ConfigurationError) as info:
        SLURMEnvironment().validate_settings(2, 3)
    text = str(info.value)
    assert "2 nodes" in text and "num_nodes=3" in text and "--nodes=3" in text


def test_validate_world_size_with_uneven_tasks_per_node(env):
    env(SLURM_NTASKS=3, SLURM_PROCID=0, SLURM_LOCALID=0, SLURM_NODEID=0, SLURM_JOB_NAME="train",
        SLURM_TASKS_PER_NODE="2,1")
    with pytest.raises(ConfigurationError) as info:
        SLURMEnvironment().validate_settings(2, 1)
    text = str(info.value)
    assert "SLURM started 3 processes (SLURM_NTASKS=3)" in text and "devices=2 x num_nodes=1 = 2" in text


def test_ntasks_without_any_tasks_per_node_is_refused_at_creation(env):
    """--ntasks=3 with no per-node variable at all (srun always sets SLURM_TASKS_PER_NODE): refused, as Lightning."""
    env(SLURM_NTASKS=3, SLURM_PROCID=0, SLURM_LOCALID=0, SLURM_NODEID=0, SLURM_JOB_NAME="train")
    with pytest.raises(LauncherSettingsError) as info:
        SLURMEnvironment()
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ConfigurationError)
    text = str(info.value)
    assert "`--ntasks=3`" in text and "--ntasks-per-node" in text
    env(SLURM_NTASKS=1)
    SLURMEnvironment()  # one task needs no layout


@pytest.mark.parametrize("value", ["2(x3)", "2"])
def test_tasks_per_node_from_slurm_tasks_per_node(env, value):
    env(SLURM_NTASKS=6, SLURM_PROCID=0, SLURM_LOCALID=0, SLURM_NODEID=0, SLURM_TASKS_PER_NODE=value)
    with pytest.raises(ConfigurationError, match="2 tasks per node"):
        SLURMEnvironment().validate_settings(3, 2)


def test_heterogeneous_tasks_per_node_is_not_compared(env):
    env(SLURM_NTASKS=3, SLURM_PROCID=0, SLURM_LOCALID=0, SLURM_NODEID=0, SLURM_TASKS_PER_NODE="2,1")
    SLURMEnvironment().validate_settings(3, 1)  # only the total can be checked, and it agrees
