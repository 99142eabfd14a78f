"""Cluster environments behave as Lightning's do where a ported program can tell: ports, errors, names, log lines."""

from __future__ import annotations

import logging
import sys
import types
import warnings

import pytest

from torchfleet.environments import (
    KubeflowEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from torchfleet.environments import mpi as mpi_module
from torchfleet.environments import slurm as slurm_module
from torchfleet.errors import ConfigurationError, MissingEnvironmentVariableError, PossibleUserWarning


def _rankfile(tmp_path, hosts=("launch", "h1", "h2")):
    path = tmp_path / "rankfile"
    path.write_text("\n".join(hosts) + "\n")
    return path


# ------------------------------------------------------------------------------------------------ LSF
def test_lsf_port_is_10000_plus_the_last_three_digits(env, tmp_path):
    env(LSB_JOBID=4567, LSB_DJOB_RANKFILE=_rankfile(tmp_path))
    assert LSFEnvironment().main_port == 10567
    env(LSB_JOBID=3)
    assert LSFEnvironment().main_port == 10003


@pytest.mark.parametrize(
    "variables, phrase",
    [
        (dict(LSB_JOBID=1), "Did not find the environment variable `LSB_DJOB_RANKFILE`"),
        (dict(LSB_JOBID=1, LSB_DJOB_RANKFILE=""), "The environment variable `LSB_DJOB_RANKFILE` is empty"),
        (dict(LSB_JOBID=1, LSB_DJOB_RANKFILE="/nonexistent/rankfile"), "names no readable file"),
    ],
)
def test_lsf_without_hosts_fails_at_creation(env, variables, phrase):
    env(**variables)
    with pytest.raises(ConfigurationError) as info:
        LSFEnvironment()
    assert phrase in str(info.value) and "LSB_MCPU_HOSTS" in str(info.value)


def test_lsf_without_job_id_fails_at_creation_unless_master_port_is_set(env, tmp_path):
    env(LSB_DJOB_RANKFILE=_rankfile(tmp_path))
    with pytest.raises(ConfigurationError, match="Could not find job id in environment variable LSB_JOBID"):
        LSFEnvironment()
    env(MASTER_PORT=4321)
    assert LSFEnvironment().main_port == 4321


def test_lsf_is_detected_without_the_global_rank_variable(env, tmp_path):
    env(LSB_JOBID=1, JSM_NAMESPACE_SIZE=2, JSM_NAMESPACE_LOCAL_RANK=0)
    assert not LSFEnvironment.detect()  # no host list: the job's hosts are unknown
    env(LSB_DJOB_RANKFILE=_rankfile(tmp_path))
    assert LSFEnvironment.detect()


# ---------------------------------------------------------------------------------------------- SLURM
def test_slurm_job_name_and_integer_job_id(env):
    assert (SLURMEnvironment.job_name(), SLURMEnvironment.job_id()) == (None, None)
    env(SLURM_JOB_NAME="train", SLURM_JOB_ID="0004242")
    assert (SLURMEnvironment.job_name(), SLURMEnvironment.job_id()) == ("train", 4242)
    env(SLURM_JOB_NAME="interactive")
    assert SLURMEnvironment.job_id() is None  # an interactive shell is not the job that trains


def test_slurm_requeue_still_names_the_array_task(env, monkeypatch):
    env(SLURM_JOB_ID=99)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "7")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert SLURMEnvironment._requeue_id() == "7_3"


def test_slurm_port_is_15000_plus_the_last_four_digits(env):
    env(SLURM_JOB_ID=1234567)
    assert SLURMEnvironment().main_port == 15000 + 4567


def test_slurm_warns_when_srun_exists_but_did_not_start_the_process(env, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fit.py", "--epochs", "2"])
    monkeypatch.setattr(slurm_module.shutil, "which", lambda name: "/usr/bin/srun" if name == "srun" else None)
    with pytest.warns(PossibleUserWarning, match=r"`srun` .* available .* but is not used\. HINT: .*srun \S+ fit\.py"):
        assert not SLURMEnvironment.detect()
    env(SLURM_NTASKS=1)  # srun started it: nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SLURMEnvironment.detect()
        SLURMEnvironment()


def test_slurm_checks_nothing_in_an_interactive_shell(env):
    env(SLURM_NTASKS_PER_NODE=4, SLURM_NNODES=2, SLURM_JOB_NAME="train")
    with pytest.raises(ConfigurationError, match="the number of tasks per node configured in SLURM .* does not match"):
        SLURMEnvironment().validate_settings(2, 2)
    with pytest.raises(ConfigurationError, match="the number of nodes configured in SLURM .* does not match"):
        SLURMEnvironment().validate_settings(4, 1)
    env(SLURM_JOB_NAME="interactive")  # torchfleet starts the processes there, not SLURM
    SLURMEnvironment().validate_settings(2, 1)


# ------------------------------------------------------------------------------- torchrun and Kubeflow
def test_missing_rank_variables_are_key_errors_too(env):
    e = TorchElasticEnvironment()
    for read in (e.world_size, e.global_rank, e.local_rank):
        with pytest.raises(KeyError) as info:
            read()
        assert isinstance(info.value, ConfigurationError)
        assert not str(info.value).startswith("'")  # the paragraph, not KeyError's quoted repr
    assert e.main_port == 12910  # Lightning's default when MASTER_PORT is missing


def test_kubeflow_needs_the_address_and_port_the_job_sets(env):
    e = KubeflowEnvironment()
    with pytest.raises(MissingEnvironmentVariableError, match="MASTER_ADDR"):
        _ = e.main_address
    with pytest.raises(KeyError, match="MASTER_PORT"):
        _ = e.main_port
    env(MASTER_ADDR="master-0", MASTER_PORT=23456)
    assert (e.main_address, e.main_port) == ("master-0", 23456)


def test_torchelastic_mismatch_names_the_product_and_world_size(env):
    env(WORLD_SIZE=8, RANK=0, LOCAL_RANK=0)
    with pytest.raises(ConfigurationError, match=r"the product \(2 \* 2\) does not match the world size \(8\)"):
        TorchElasticEnvironment().validate_settings(2, 2)


@pytest.mark.parametrize("which", ["torchelastic", "slurm", "mpi"])
def test_setters_say_at_debug_level_that_they_are_ignored(env, caplog, which):
    env(WORLD_SIZE=2, RANK=1, LOCAL_RANK=0, SLURM_NTASKS=2, SLURM_PROCID=1, SLURM_TASKS_PER_NODE=2,
        PMI_SIZE=2, PMI_RANK=1)
    e = {"torchelastic": TorchElasticEnvironment, "slurm": SLURMEnvironment, "mpi": MPIEnvironment}[which]()
    with caplog.at_level(logging.DEBUG, logger="torchfleet.environments"):
        e.set_global_rank(5)
        e.set_world_size(9)
    assert (e.global_rank(), e.world_size()) == (1, 2)
    assert "setting global rank is not allowed" in caplog.text and "setting world size is not allowed" in caplog.text


# ------------------------------------------------------------------------------------------------ MPI
class _FakeComm:
    """One rank's COMM_WORLD: ``from_root`` holds, in call order, what rank 0 broadcasts to the other ranks."""

    def __init__(self, rank: int, size: int, hosts: list[str], from_root: list | None = None):
        self.rank, self.size, self.hosts, self.from_root, self.split_colors = rank, size, hosts, from_root or [], []

    def Get_rank(self) -> int:  # noqa: N802 (mpi4py's spelling)
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def gather(self, value, root):
        return list(self.hosts) if self.rank == root else None

    def bcast(self, value, root):
        return value if self.rank == root else self.from_root.pop(0)

    def Split(self, color):  # noqa: N802
        self.split_colors.append(color)
        return types.SimpleNamespace(Get_rank=lambda: self.rank % 2)


@pytest.fixture
def fake_mpi4py(monkeypatch):
    def install(comm: _FakeComm) -> None:
        module = types.ModuleType("mpi4py")
        module.MPI = types.SimpleNamespace(COMM_WORLD=comm)
        monkeypatch.setitem(sys.modules, "mpi4py", module)
        monkeypatch.setattr(mpi_module, "_MPI4PY_AVAILABLE", True)

    return install


def test_mpi_without_mpi4py_or_a_launcher_is_a_missing_module(env, monkeypatch):
    monkeypatch.setattr(mpi_module, "_MPI4PY_AVAILABLE", False)
    assert not MPIEnvironment.detect()
    with pytest.raises(ModuleNotFoundError, match="mpi4py"):
        MPIEnvironment()
    env(OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_RANK=1)
    assert MPIEnvironment().world_size() == 2  # the launcher's variables suffice


def test_mpi_with_mpi4py_asks_mpi(env, fake_mpi4py, monkeypatch):
    # rank 3 of 4 on host-b; rank 0 broadcasts the sorted host names, its own host name, then its free port
    comm = _FakeComm(rank=3, size=4, hosts=[], from_root=[["host-a", "host-b"], "host-a", 20001])
    fake_mpi4py(comm)
    monkeypatch.setattr(mpi_module.socket, "gethostname", lambda: "host-b")
    assert MPIEnvironment.detect()
    e = MPIEnvironment()
    assert (e.world_size(), e.global_rank()) == (4, 3)
    assert e.node_rank() == 1  # host-b is second among the sorted host names
    assert comm.split_colors == [1]  # the ranks of one host form the local communicator
    assert e.local_rank() == 1
    assert (e.main_address, e.main_port) == ("host-a", 20001)  # rank 0's, broadcast, asked once
    assert (e.main_address, e.main_port) == ("host-a", 20001)
    env(MASTER_ADDR="n0", MASTER_PORT=5555)
    assert (e.main_address, e.main_port) == ("n0", 5555)
    e.validate_settings(2, 2)
    with pytest.raises(ConfigurationError, match=r"the product \(1 \* 2\) does not match the world size \(4\)"):
        e.validate_settings(1, 2)


def test_mpi_rank_zero_collects_the_host_names(env, fake_mpi4py, monkeypatch):
    comm = _FakeComm(rank=0, size=4, hosts=["h2", "h1", "h2", "h1"])
    fake_mpi4py(comm)
    monkeypatch.setattr(mpi_module.socket, "gethostname", lambda: "h2")
    e = MPIEnvironment()
    assert (e.node_rank(), e.main_address) == (1, "h2")
    assert 0 < e.main_port < 65536  # a port rank 0 found free


def test_mpi_with_mpi4py_on_one_process_is_not_detected(env, fake_mpi4py):
    fake_mpi4py(_FakeComm(rank=0, size=1, hosts=["h"]))
    assert not MPIEnvironment.detect()
